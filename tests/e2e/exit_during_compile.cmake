# A process that exits while its background compile is still building (backend auto: the first calls
# run on the interpreter while the worker compiles) exits with status 0 and keeps its output: the
# cache's process-wide state outlives the worker's join at exit (it was destroyed first, and the
# worker then used it: status 139 and lost output in most runs of this check before).
# Usage: cmake -DPROTEAN=<path to protean> -DWORK=<scratch dir> -P exit_during_compile.cmake
if(DEFINED ENV{PROTEAN_MODELS_DIR})
  set(models $ENV{PROTEAN_MODELS_DIR})
else()
  set(models $ENV{HOME}/.cache/protean/models)
endif()
set(vad ${models}/silero_vad_v5.onnx)
if(NOT EXISTS ${vad})
  message(FATAL_ERROR "${vad} is missing: run scripts/fetch_models.sh")
endif()
foreach(i RANGE 1 4)
  file(REMOVE_RECURSE ${WORK}/cache${i})
  set(ENV{PROTEAN_CACHE_DIR} ${WORK}/cache${i})
  execute_process(COMMAND ${PROTEAN} run ${vad} input=random:1x512 state=random:2x1x128 sr=scalar:16000
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "compiles: ")
    message(FATAL_ERROR "run ${i} with an empty cache: exit ${rc}, output:\n${out}\n${err}")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK})

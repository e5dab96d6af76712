# End-to-end checks of the CLI on the real PP-OCRv4 rec model (fetched by scripts/fetch_models.sh):
#  1. `protean demo` recognizes every rendered line exactly (it exits 2 otherwise).
#  2. A width sweep under --dynamic auto compiles exactly 2 graphs (static, then W dynamic) and the
#     recompile reason names x dim 3.
# Usage: cmake -DPROTEAN=<path to protean> -DWORK=<scratch dir> -P cli_checks.cmake
if(DEFINED ENV{PROTEAN_MODELS_DIR})
  set(models $ENV{PROTEAN_MODELS_DIR})
else()
  set(models $ENV{HOME}/.cache/protean/models)
endif()
set(rec ${models}/ch_PP-OCRv4_rec_infer.onnx)
if(NOT EXISTS ${rec})
  message(FATAL_ERROR "${rec} is missing: run scripts/fetch_models.sh")
endif()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})

execute_process(COMMAND ${PROTEAN} demo --models-dir ${models} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
message(STATUS "${out}")
if(rc OR NOT out MATCHES "recognized 8/8 lines exactly")
  message(FATAL_ERROR "protean demo failed (${rc}):\n${out}\n${err}")
endif()
if(NOT out MATCHES "compiles: 2 graph\\(s\\), 1 recompile")
  message(FATAL_ERROR "protean demo should compile exactly 2 graphs:\n${out}")
endif()

execute_process(COMMAND ${PROTEAN} run ${rec} "x=random:1x3x48x{160,320,480,640}" --dynamic auto
                        --stats-json ${WORK}/stats.json -q
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "protean run failed (${rc}):\n${out}\n${err}")
endif()
file(READ ${WORK}/stats.json stats)
string(JSON compiles GET "${stats}" stats compiles)
string(JSON recompiles GET "${stats}" stats recompiles)
string(JSON ncalls LENGTH "${stats}" calls)
if(NOT compiles EQUAL 2 OR NOT recompiles EQUAL 1 OR NOT ncalls EQUAL 4)
  message(FATAL_ERROR "width sweep: expected 2 compiles, 1 recompile, 4 shapes; got ${compiles}, ${recompiles}, ${ncalls}\n${stats}")
endif()
string(JSON reason MEMBER "${stats}" stats recompile_reasons 0)
if(NOT reason MATCHES "tensor 'x' size mismatch at index 3\\. expected 160, actual 320")
  message(FATAL_ERROR "unexpected recompile reason: ${reason}")
endif()
message(STATUS "width sweep: ${compiles} compiles; reason: ${reason}")

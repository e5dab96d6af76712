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

# The width sweep's compile count does not depend on the backend: the interpreter keeps it fast.
execute_process(COMMAND ${PROTEAN} run ${rec} "x=random:1x3x48x{160,320,480,640}" --dynamic auto --backend interp
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

# 3. Bad input is refused before anything runs, with a message naming what is wrong, and exit code 1
#    (option errors exit 2): no "internal error" (exit 3).
file(WRITE ${WORK}/a_file "x")
file(MAKE_DIRECTORY ${WORK}/a_dir.npy)
# one case per entry: the arguments separated by '~', then '|' and a regular expression the output must match
set(bad_cases
  "run~${models}~x=random:1x3x48x160|is a directory. pass the .onnx file"
  "run~${WORK}/nope.onnx~x=random:1x3x48x160|cannot open ONNX model .*: no such file"
  "run~${rec}~x=random:1x3x48x160~--save-outputs~${WORK}/a_file|--save-outputs .* is a file. it must be a directory"
  "run~${rec}~x=random:1x3x48x160~--stats-json~${WORK}/nope/s.json|--stats-json .*: directory .* does not exist"
  "run~${rec}~x=${WORK}/nope.png~--preprocess~ocr-rec|input 'x': file .*nope.png' does not exist"
  "run~${rec}~x=${WORK}/nope.npy|input 'x': file .*nope.npy' does not exist"
  "run~${rec}~x=${WORK}/a_dir.npy|input 'x': '.*a_dir.npy' is a directory, not a file"
  "run~${rec}~x:random:1x3x48x160|inputs are written NAME=VALUE"
  "run~${rec}~x=random:1x3x48x160~--preprocess~bogus|--preprocess: bogus not in"
  "run~${rec}~x=random:1x3x48x160~--threads~0|--threads: Value 0 not in range 1 to 4096"
  "demo~--dynamic~maybe|--dynamic: maybe not in"
  "run~${rec}~x=random:1x3x48x160~--trace-dir~/proc/nope|trace directory '/proc/nope' .*: cannot create it"
  "report~${WORK}/empty_traces~--plain-text|no \\*\\.jsonl trace files in .*: write a trace first"
  "pgo~show~--job~no-such-job-cli-check|job no-such-job-cli-check: no profiles under")
file(MAKE_DIRECTORY ${WORK}/empty_traces)
foreach(case ${bad_cases})
  string(FIND "${case}" "|" bar REVERSE)
  string(SUBSTRING "${case}" 0 ${bar} args)
  math(EXPR after "${bar} + 1")
  string(SUBSTRING "${case}" ${after} -1 expect)
  string(REPLACE "~" ";" parts "${args}")
  execute_process(COMMAND ${PROTEAN} ${parts} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT (rc EQUAL 1 OR rc EQUAL 2) OR NOT "${out}${err}" MATCHES "${expect}")
    message(FATAL_ERROR "protean ${parts}: expected exit 1 (or 2 for bad arguments) and '${expect}', got ${rc}:\n${out}\n${err}")
  endif()
endforeach()
list(LENGTH bad_cases nbad)
message(STATUS "bad input: ${nbad} cases refused with their messages")

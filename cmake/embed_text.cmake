# Writes a C++ source defining `extern const char NAME[]` as the text of file IN, without its lines
# that begin with `//!` (documentation of the file itself, not part of the embedded text).
#   cmake -DIN=path -DOUT=path -DNAME=identifier -DNAMESPACE=ns -P embed_text.cmake
file(READ "${IN}" text)
string(REGEX REPLACE "//![^\n]*\n" "" text "${text}")
string(FIND "${text}" ")PTEMBED\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${IN} contains the raw-string delimiter )PTEMBED\"")
endif()
file(WRITE "${OUT}.tmp" "// Generated from ${IN} by cmake/embed_text.cmake. Do not edit.\nnamespace ${NAMESPACE} {\nextern const char ${NAME}[];\nconst char ${NAME}[] = R\"PTEMBED(${text})PTEMBED\";\n}  // namespace ${NAMESPACE}\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")

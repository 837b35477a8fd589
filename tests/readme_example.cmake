# Fails unless README.md contains examples/core_quickstart.cpp verbatim, so the usage example a
# user copies is code that CI compiles and runs.
file(READ "${SOURCE_DIR}/README.md" readme)
file(READ "${SOURCE_DIR}/examples/core_quickstart.cpp" example)
string(FIND "${readme}" "${example}" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR "README.md does not contain examples/core_quickstart.cpp verbatim; copy the file into README's usage section")
endif()

# Fails unless README.md contains each example it shows verbatim, so the code a user copies is
# code that CI compiles and runs.
file(READ "${SOURCE_DIR}/README.md" readme)
foreach(example IN ITEMS quickstart.cpp core_quickstart.cpp tiers.cpp custom_pipeline.cpp object_store.cpp)
  file(READ "${SOURCE_DIR}/examples/${example}" text)
  string(FIND "${readme}" "${text}" pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "README.md does not contain examples/${example} verbatim; copy the file into README")
  endif()
endforeach()

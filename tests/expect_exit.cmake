# Runs a command and checks both its exit code and its output, for command-line error paths:
#   cmake -DEXPECT_RC=2 "-DEXPECT_OUTPUT=regex" -P expect_exit.cmake -- <command> [args...]
include(${CMAKE_CURRENT_LIST_DIR}/command_after_dashes.cmake)
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT "${rc}" STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "expected exit code ${EXPECT_RC}, got ${rc}\nstdout: ${out}\nstderr: ${err}")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT_OUTPUT}")
  message(FATAL_ERROR "output does not match '${EXPECT_OUTPUT}'\nstdout: ${out}\nstderr: ${err}")
endif()
# -DEXPECT_NO_FILE=<path>: and the command left no file or directory there.
if(DEFINED EXPECT_NO_FILE AND (EXISTS "${EXPECT_NO_FILE}" OR IS_SYMLINK "${EXPECT_NO_FILE}"))
  message(FATAL_ERROR "the command left ${EXPECT_NO_FILE} behind\nstdout: ${out}\nstderr: ${err}")
endif()

# offload_demo must remove only what it created: run it on a directory holding a user's file and
# on a directory it has to create, then check that the user's file (and directory) are intact,
# that none of the demo's objects or lock files are left, and that the directory it made is gone.
#   cmake -DDEMO=<offload_demo> -DDIR=<scratch dir> -P demo_keeps_user_files.cmake
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}/user")
file(WRITE "${DIR}/user/notes.txt" "mine")
execute_process(COMMAND "${DEMO}" --params 200000 --subgroup 50000 --steps 1 --threads 2 --path "${DIR}/user"
                        --path "${DIR}/made/by/demo"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "offload_demo failed (${rc}):\n${out}\n${err}")
endif()
file(GLOB left LIST_DIRECTORIES true "${DIR}/user/*" "${DIR}/user/.*")
if(NOT left STREQUAL "${DIR}/user/notes.txt")
  message(FATAL_ERROR "expected only the user's notes.txt in ${DIR}/user, found: ${left}")
endif()
file(READ "${DIR}/user/notes.txt" notes)
if(NOT notes STREQUAL "mine")
  message(FATAL_ERROR "the user's file changed: '${notes}'")
endif()
if(EXISTS "${DIR}/made")
  message(FATAL_ERROR "the directories offload_demo made are still there: ${DIR}/made")
endif()
message(STATUS "ok")

# The names strata reserves in a path are strata's only when strata made the file there, and a run
# leaves a path as it found it:
# - a user's .strata-lock (and scoped .strata-lock.<x>) in a path: exit 1 with one line naming
#   it, the file unchanged, and the directory the run made for another path gone;
# - --adopt-existing takes another job's objects ("strata.sg-<i>") and nothing else: a user's
#   thesis.txt beside them is all that is left, no journal, no lock;
# - a run that leaves its state (--keep, as a killed run does) leaves the directories it made;
#   the next clean run removes them.
#   cmake -DDEMO=<offload_demo> -DDIR=<scratch dir> -P demo_reserved_names.cmake
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}/locked" "${DIR}/adopt")
file(WRITE "${DIR}/locked/.strata-lock" "the user's lock")
file(WRITE "${DIR}/locked/.strata-lock.x" "")
set(small --params 200000 --subgroup 50000 --steps 1 --threads 2)
function(expect_only dir expected)
  file(GLOB left LIST_DIRECTORIES true RELATIVE "${dir}" "${dir}/*" "${dir}/.*")
  list(SORT left)
  if(NOT "${left}" STREQUAL "${expected}")
    message(FATAL_ERROR "expected only '${expected}' in ${dir}, found: '${left}'")
  endif()
endfunction()

execute_process(COMMAND "${DEMO}" ${small} --path "${DIR}/made/by/demo" --path "${DIR}/locked"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1 OR NOT err MATCHES "offload_demo: [^\n]*locked/\\.strata-lock is [^\n]*not a lock file strata made")
  message(FATAL_ERROR "expected exit 1 naming locked/.strata-lock, got ${rc}:\n${out}\n${err}")
endif()
file(READ "${DIR}/locked/.strata-lock" lock)
if(NOT lock STREQUAL "the user's lock")
  message(FATAL_ERROR "the user's .strata-lock changed: '${lock}'")
endif()
expect_only("${DIR}/locked" ".strata-lock;.strata-lock.x")
expect_only("${DIR}" "adopt;locked")  # the directories made for the other path are gone

file(WRITE "${DIR}/adopt/strata.sg-1" "another job's subgroup")
file(WRITE "${DIR}/adopt/thesis.txt" "mine")
execute_process(COMMAND "${DEMO}" ${small} --adopt-existing --path "${DIR}/adopt"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "--adopt-existing failed (${rc}):\n${out}\n${err}")
endif()
expect_only("${DIR}/adopt" "thesis.txt")
file(READ "${DIR}/adopt/thesis.txt" thesis)
if(NOT thesis STREQUAL "mine")
  message(FATAL_ERROR "the user's thesis.txt changed: '${thesis}'")
endif()

execute_process(COMMAND "${DEMO}" ${small} --keep --path "${DIR}/kept/deep" RESULT_VARIABLE rc OUTPUT_QUIET
                ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT EXISTS "${DIR}/kept/deep/strata.sg-0")
  message(FATAL_ERROR "--keep did not keep the state (${rc}):\n${err}")
endif()
execute_process(COMMAND "${DEMO}" ${small} --path "${DIR}/kept/deep" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the run after --keep failed (${rc}):\n${err}")
endif()
expect_only("${DIR}" "adopt;locked")  # kept/deep, made by the first run, went with the second
message(STATUS "ok")

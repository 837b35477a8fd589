# A crash never leaves an object-store prefix that stops the next run, and nothing of a user's is
# touched: offload_demo over a directory and an s3:// prefix of the S3 test server is SIGKILLed
# KILLS times at random points (start-up and its claim, the initial write, steps, the clean-up),
# each run started again as it is (no --adopt-existing); a last run must then finish and leave
# the prefix and the directory exactly as they were before the first run: the user's object and
# file unchanged, and no state object, claim, journal or lock left.
#   cmake -DDEMO=<offload_demo> -DENV_FILE=<tests/s3/s3-server/env> -DDIR=<scratch dir> -DKILLS=<kills>
#         -P demo_s3_kill_loop.cmake
# Without a server it prints "strata-s3-skip:" (ctest: Skipped), or fails when STRATA_REQUIRE_S3
# is set; see s3_command.cmake, whose handling of the server's env file this repeats.
cmake_minimum_required(VERSION 3.21)

if(NOT EXISTS "${ENV_FILE}")
  if(NOT "$ENV{STRATA_REQUIRE_S3}" STREQUAL "")
    message(FATAL_ERROR "STRATA_REQUIRE_S3 is set but there is no S3 server: ${ENV_FILE} does not exist")
  endif()
  message("strata-s3-skip: no S3 server (${ENV_FILE} does not exist: no weed binary)")
  return()
endif()

file(STRINGS "${ENV_FILE}" env_lines)
set(bucket "")
foreach(line IN LISTS env_lines)
  string(FIND "${line}" "=" eq)
  if(eq LESS 1)
    continue()
  endif()
  string(SUBSTRING "${line}" 0 ${eq} key)
  math(EXPR vstart "${eq} + 1")
  string(SUBSTRING "${line}" ${vstart} -1 value)
  if(key MATCHES "^AWS_")
    set(ENV{${key}} "${value}")
    set(s3_${key} "${value}")
  elseif(key STREQUAL "S3_TEST_BUCKET")
    set(bucket "${value}")
  endif()
endforeach()
if(bucket STREQUAL "" OR "${s3_AWS_ENDPOINT_URL}" STREQUAL "")
  message(FATAL_ERROR "${ENV_FILE} has no S3_TEST_BUCKET or AWS_ENDPOINT_URL")
endif()

string(TIMESTAMP now "%Y%m%d%H%M%S" UTC)
string(RANDOM LENGTH 8 ALPHABET "abcdefghijklmnopqrstuvwxyz0123456789" salt)
set(prefix "ctest/kill-loop-${now}-${salt}")
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}/a")
file(WRITE "${DIR}/a/notes.txt" "mine")

set(curl_config "${DIR}.curl-config")  # beside DIR: DIR must hold only what the runs leave
include(${CMAKE_CURRENT_LIST_DIR}/s3_curl.cmake)

# The user's object, in the prefix before the first run.
set(foreign_text "a user's object, not strata's: ${now}-${salt}\n")
file(WRITE "${DIR}/foreign" "${foreign_text}")
s3_request(ignored -T "${DIR}/foreign" "${endpoint}/${bucket}/${prefix}/user-notes.txt")
file(REMOVE "${DIR}/foreign")

# DIR/a/made is made by the first run (a path that does not exist yet); the store's prefix is shared.
set(args --params 1000000 --subgroup 60000 --threads 2 --budget 16MiB --path "${DIR}/a/made"
         --path "s3://${bucket}/${prefix}")
set(killed 0)
set(runs 0)
set(failure "")
math(EXPR max_runs "${KILLS} * 3")
while(killed LESS KILLS AND runs LESS max_runs)
  math(EXPR runs "${runs} + 1")
  # Long runs (40 steps, 1-3 s) are killed in start-up and its claim, the initial write or a step;
  # short ones (1 step, about 0.3 s) also in their clean-up (remove_state, the claim's removal),
  # or end (and must then have left nothing that stops the next).
  math(EXPR odd "${runs} % 2")
  string(RANDOM LENGTH 3 ALPHABET 0123456789 ms)
  math(EXPR ms "1${ms} - 1000")  # 0..999
  if(odd)
    set(steps 40)
    math(EXPR ms "30 + ${ms} * 9 / 10")  # 30 to 929 ms
  else()
    set(steps 1)
    math(EXPR ms "30 + ${ms} * 4 / 10")  # 30 to 429 ms
  endif()
  if(ms LESS 100)
    set(ms "0${ms}")
  endif()
  execute_process(COMMAND timeout -s KILL 0.${ms} "${DEMO}" ${args} --steps ${steps} RESULT_VARIABLE rc OUTPUT_QUIET
                  ERROR_VARIABLE err)
  if(rc EQUAL 137 OR rc MATCHES "killed")  # (timeout signals its own process group too)
    math(EXPR killed "${killed} + 1")
  elseif(NOT rc EQUAL 0)
    set(failure "run ${runs} (killed after 0.${ms} s or not) failed with ${rc}: it did not restart by itself:\n${err}")
    break()
  endif()
endwhile()
if(failure STREQUAL "" AND killed LESS KILLS)
  set(failure "only ${killed} of ${runs} runs were killed (${KILLS} are needed): the runs are too short")
endif()
if(failure STREQUAL "")
  execute_process(COMMAND "${DEMO}" ${args} --steps 2 RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    set(failure "the run after ${killed} kills failed (${rc}):\n${out}\n${err}")
  endif()
endif()

# The prefix: the user's object alone, unchanged (no state object, no claim).
s3_keys(left)
if(failure STREQUAL "")
  if(NOT "${left}" STREQUAL "${prefix}/user-notes.txt")
    set(failure "s3://${bucket}/${prefix}/ should hold only user-notes.txt, but holds: ${left}")
  else()
    s3_request(body "${endpoint}/${bucket}/${prefix}/user-notes.txt")
    if(NOT body STREQUAL foreign_text)
      set(failure "the user's object ${prefix}/user-notes.txt changed")
    endif()
  endif()
endif()
# The directory: the user's file alone, unchanged (no state file, journal or lock). A killed
# run's directory (DIR/a/made) is tolerated only when empty: file_tier records a directory it
# makes in its journal and the clean run removes it, but a kill in the microseconds between the
# mkdir and the journal's creation leaves one that nothing records.
if(failure STREQUAL "")
  file(GLOB_RECURSE left_files LIST_DIRECTORIES true "${DIR}/*")
  file(GLOB_RECURSE left_hidden LIST_DIRECTORIES true "${DIR}/.*" "${DIR}/a/.*" "${DIR}/a/made/.*")
  list(APPEND left_files ${left_hidden})
  list(REMOVE_ITEM left_files "${DIR}/a" "${DIR}/a/notes.txt" "${DIR}/a/made")
  if(left_files)
    set(failure "expected only the user's notes.txt in ${DIR}, found: ${left_files}")
  else()
    file(READ "${DIR}/a/notes.txt" notes)
    if(NOT notes STREQUAL "mine")
      set(failure "the user's file changed: '${notes}'")
    endif()
  endif()
endif()
foreach(key IN LISTS left)  # leave the server as found
  s3_request(ignored -X DELETE "${endpoint}/${bucket}/${key}")
endforeach()
file(REMOVE "${curl_config}")
if(NOT failure STREQUAL "")
  message(FATAL_ERROR "${failure}")
endif()
set(made "")
if(EXISTS "${DIR}/a/made")
  set(made " (a killed run's empty ${DIR}/a/made remains: killed between its mkdir and its journal)")
endif()
message(STATUS "ok: ${killed} of ${runs} runs killed, each restarted as it was, then a clean run${made}")

# Runs strata's tools against the S3 test server (the strata_s3_server fixture, tests/s3) and checks
# what they print and what they leave in the bucket:
#
#   cmake -DENV_FILE=<tests/s3/s3-server/env> -DSCRATCH=<dir> -DNAME=<test>
#         [-DEXPECT_RC=0] [-DEXPECT_OUTPUT=<regex>] [-DEXPECT_RC_2=... -DEXPECT_OUTPUT_2=...] ...
#         [-DEXPECT_FILE=<path> -DEXPECT_FILE_OUTPUT=<regex>] [-DFOREIGN=<name>] [-DGONE=<path>]
#         -P s3_command.cmake -- <command> [args...] [--then <command 2> [args...]]...
#
# In every argument @BUCKET@ is the server's bucket and @PREFIX@ a prefix of this run's own
# ("ctest/<NAME>-<time>-<random>"); @SCRATCH@ is SCRATCH, emptied first. Each command's exit code
# and output (stdout and stderr) must match its EXPECT_RC_<i> and EXPECT_OUTPUT_<i> (the first
# command's: EXPECT_RC, EXPECT_OUTPUT). FOREIGN puts an object of that name under the prefix
# before the commands (another user's, in a key form no tier uses) that must be there, unchanged,
# after them. Afterwards the prefix must hold nothing else (the tools remove what they wrote), and
# GONE (a directory a tool made) must not exist.
#
# Without a server (no ENV_FILE: tools/s3-server.sh found no weed binary) it prints
# "strata-s3-skip: no S3 server" and succeeds, which ctest reports as Skipped through the test's
# SKIP_REGULAR_EXPRESSION; with STRATA_REQUIRE_S3 set that is a failure. Only the AWS_* lines of
# ENV_FILE go into the commands' environment (its secret is never printed).
cmake_minimum_required(VERSION 3.21)

if(NOT EXISTS "${ENV_FILE}")
  if(NOT "$ENV{STRATA_REQUIRE_S3}" STREQUAL "")
    message(FATAL_ERROR "STRATA_REQUIRE_S3 is set but there is no S3 server: ${ENV_FILE} does not exist "
                        "(the strata_s3_server fixture did not start one)")
  endif()
  message("strata-s3-skip: no S3 server (${ENV_FILE} does not exist: no weed binary; tools/install-deps.sh installs it)")
  return()
endif()

# The commands, split at "--then".
set(ncmd 0)
set(after_dashes FALSE)
foreach(i RANGE ${CMAKE_ARGC})
  if(i EQUAL CMAKE_ARGC)
    break()
  endif()
  set(arg "${CMAKE_ARGV${i}}")
  if(after_dashes)
    if(arg STREQUAL "--then" OR ncmd EQUAL 0)
      math(EXPR ncmd "${ncmd} + 1")
      set(cmd_${ncmd} "")
      if(arg STREQUAL "--then")
        continue()
      endif()
    endif()
    list(APPEND cmd_${ncmd} "${arg}")
  elseif(arg STREQUAL "--")
    set(after_dashes TRUE)
  endif()
endforeach()
if(ncmd EQUAL 0)
  message(FATAL_ERROR "s3_command.cmake: no command after --")
endif()

# The server: its AWS_* variables for the commands, its bucket and endpoint for the checks here.
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
foreach(key AWS_ENDPOINT_URL AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_REGION)
  if("${s3_${key}}" STREQUAL "")
    message(FATAL_ERROR "${ENV_FILE} has no ${key}")
  endif()
endforeach()
if(bucket STREQUAL "")
  message(FATAL_ERROR "${ENV_FILE} has no S3_TEST_BUCKET")
endif()

string(TIMESTAMP now "%Y%m%d%H%M%S" UTC)
string(RANDOM LENGTH 8 ALPHABET "abcdefghijklmnopqrstuvwxyz0123456789" salt)
set(prefix "ctest/${NAME}-${now}-${salt}")
file(REMOVE_RECURSE "${SCRATCH}")
file(MAKE_DIRECTORY "${SCRATCH}")

set(curl_config "${SCRATCH}/.curl-config")
include(${CMAKE_CURRENT_LIST_DIR}/s3_curl.cmake)

set(foreign_text "a user's object, not strata's: ${now}-${salt}\n")
if(DEFINED FOREIGN AND NOT FOREIGN STREQUAL "")
  file(WRITE "${SCRATCH}/foreign" "${foreign_text}")
  s3_request(ignored -T "${SCRATCH}/foreign" "${endpoint}/${bucket}/${prefix}/${FOREIGN}")
endif()

set(failure "")
foreach(i RANGE 1 ${ncmd})
  set(cmd "")
  foreach(arg IN LISTS cmd_${i})
    string(REPLACE "@BUCKET@" "${bucket}" arg "${arg}")
    string(REPLACE "@PREFIX@" "${prefix}" arg "${arg}")
    string(REPLACE "@SCRATCH@" "${SCRATCH}" arg "${arg}")
    list(APPEND cmd "${arg}")
  endforeach()
  if(i EQUAL 1)
    set(want_rc "${EXPECT_RC}")
    set(want_out "${EXPECT_OUTPUT}")
  else()
    set(want_rc "${EXPECT_RC_${i}}")
    set(want_out "${EXPECT_OUTPUT_${i}}")
  endif()
  if(want_rc STREQUAL "")
    set(want_rc 0)
  endif()
  string(REPLACE ";" " " shown "${cmd}")
  message(STATUS "command ${i}: ${shown}")
  execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("--- stdout:\n${out}--- stderr:\n${err}---")
  if(NOT "${rc}" STREQUAL "${want_rc}")
    set(failure "command ${i} exited with ${rc}, expected ${want_rc}")
    break()
  endif()
  if(NOT want_out STREQUAL "" AND NOT "${out}${err}" MATCHES "${want_out}")
    set(failure "the output of command ${i} does not match '${want_out}'")
    break()
  endif()
endforeach()

if(failure STREQUAL "" AND DEFINED EXPECT_FILE)
  if(NOT EXISTS "${EXPECT_FILE}")
    set(failure "${EXPECT_FILE} was not written")
  else()
    file(READ "${EXPECT_FILE}" text)
    if(NOT text MATCHES "${EXPECT_FILE_OUTPUT}")
      set(failure "${EXPECT_FILE} does not match '${EXPECT_FILE_OUTPUT}'")
    endif()
  endif()
endif()

# What the prefix holds now: the foreign object alone (unchanged), or nothing.
s3_keys(left)
set(expected "")
if(DEFINED FOREIGN AND NOT FOREIGN STREQUAL "")
  set(expected "${prefix}/${FOREIGN}")
  if("${expected}" IN_LIST left)
    s3_request(body "${endpoint}/${bucket}/${prefix}/${FOREIGN}")
    if(failure STREQUAL "" AND NOT body STREQUAL foreign_text)
      set(failure "the foreign object ${prefix}/${FOREIGN} changed")
    endif()
  elseif(failure STREQUAL "")
    set(failure "the foreign object ${prefix}/${FOREIGN} is gone")
  endif()
endif()
if(failure STREQUAL "" AND NOT "${left}" STREQUAL "${expected}")
  set(failure "s3://${bucket}/${prefix}/ should hold only '${expected}' after the commands, but holds: ${left}")
endif()
if(failure STREQUAL "" AND DEFINED GONE AND EXISTS "${GONE}")
  set(failure "${GONE} is still there")
endif()
# Leave the server as found: remove what is left under the prefix (a failed run's objects too).
foreach(key IN LISTS left)
  s3_request(ignored -X DELETE "${endpoint}/${bucket}/${key}")
endforeach()
file(REMOVE "${curl_config}")
if(NOT failure STREQUAL "")
  message(FATAL_ERROR "${failure}")
endif()
message(STATUS "ok")

# The bucket checks of the S3 test scripts, included after they set `curl_config` (where curl's
# config file goes: it keeps the secret off command lines) and read the s3_AWS_* settings, bucket
# and prefix. curl signs the requests (SigV4). Defines `endpoint`, s3_request and s3_keys.
find_program(CURL curl)
if(NOT CURL)
  message(FATAL_ERROR "curl is needed to check what a test leaves in the bucket")
endif()
file(WRITE "${curl_config}" "")
file(CHMOD "${curl_config}" PERMISSIONS OWNER_READ OWNER_WRITE)
file(WRITE "${curl_config}"
     "user = \"${s3_AWS_ACCESS_KEY_ID}:${s3_AWS_SECRET_ACCESS_KEY}\"\naws-sigv4 = \"aws:amz:${s3_AWS_REGION}:s3\"\n"
     "silent\nshow-error\nfail\n")
string(REGEX REPLACE "/+$" "" endpoint "${s3_AWS_ENDPOINT_URL}")

# s3_request(<out var> <curl args>...): runs curl with the credentials, fails the test on an error.
function(s3_request out)
  execute_process(COMMAND "${CURL}" -K "${curl_config}" ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE body
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "curl ${ARGN} failed (${rc}): ${err}")
  endif()
  set(${out} "${body}" PARENT_SCOPE)
endfunction()

# s3_keys(<out var>): the keys under the prefix, sorted.
function(s3_keys out)
  string(REPLACE "/" "%2F" encoded "${prefix}/")
  s3_request(body "${endpoint}/${bucket}?list-type=2&prefix=${encoded}")
  string(REGEX MATCHALL "<Key>[^<]*</Key>" tagged "${body}")
  set(keys "")
  foreach(k IN LISTS tagged)
    string(REGEX REPLACE "^<Key>(.*)</Key>$" "\\1" k "${k}")
    list(APPEND keys "${k}")
  endforeach()
  list(SORT keys)
  set(${out} "${keys}" PARENT_SCOPE)
endfunction()

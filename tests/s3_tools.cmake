# strata-bench and offload_demo with a path that is an object store, against the S3 test server
# that the strata_s3_server fixture (tests/s3/CMakeLists.txt) starts. s3_command.cmake reads the
# server's env file, gives each run a prefix of its own, runs the tool, checks its output, and
# checks that the prefix holds nothing afterwards but another user's object put there first.
# Without a server the tests print "strata-s3-skip:" and ctest reports them Skipped (unless
# STRATA_REQUIRE_S3 is set: then they fail).
if(STRATA_HAS_S3 AND STRATA_BUILD_TESTS)
  set(strata_s3_env ${CMAKE_CURRENT_BINARY_DIR}/s3/s3-server/env)  # the fixture's (tests/s3)
  set(strata_s3_run ${CMAKE_CURRENT_BINARY_DIR}/s3-tools)
  set(strata_s3_tool_tests "")

  if(STRATA_BUILD_BENCH)
    # io: the same write and read passes as on a directory, through object_store_tier, with its
    # counters (whole-object writes: multipart uploads, never a patch), plain and checksummed.
    add_test(NAME strata_bench_io_s3_reports_rates_and_tier_counters_and_removes_its_objects
             COMMAND ${CMAKE_COMMAND} -DENV_FILE=${strata_s3_env} -DSCRATCH=${strata_s3_run}/io -DNAME=io
                     -DFOREIGN=user-notes.txt
                     "-DEXPECT_OUTPUT=object store s3://[^\n]+\n  write [0-9.]+ GB/s[^\n]+\n  read  [0-9.]+ GB/s[^\n]+\n  read with XXH3 verification [0-9.]+ GB/s[^\n]+\n  tier: [0-9]+ requests \\([0-9]+ retries\\): 0 PUTs, 4 multipart uploads of 16 parts \\(0 aborted\\), 16 ranged GETs \\(16 received directly\\), 1 listings; 0 patches"
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/s3_command.cmake --
                     $<TARGET_FILE:strata_bench> io --path s3://@BUCKET@/@PREFIX@ --size 40MiB --object 20MiB
                     --part 5MiB --depth 8 --reps 2 --checksum)
    add_test(NAME strata_bench_io_s3_json_has_the_tier_counters
             COMMAND ${CMAKE_COMMAND} -DENV_FILE=${strata_s3_env} -DSCRATCH=${strata_s3_run}/io-json -DNAME=io-json
                     "-DEXPECT_OUTPUT=\"backend\": \"s3\".*\"write_GBps\": [0-9].*\"read_GBps\": [0-9].*\"s3\": {\"requests\": [1-9][0-9]*, \"retries\": [0-9]+, \"puts\": 2, \"multipart_uploads\": 0, \"parts\": 0, \"aborted_uploads\": 0, \"gets\": 2, \"direct_gets\": 2, \"patches\": 0"
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/s3_command.cmake --
                     $<TARGET_FILE:strata_bench> io --path s3://@BUCKET@/@PREFIX@/ --size 2MiB --object 1MiB --reps 1
                     --json)
    # step: a capped directory and an object store as the run-time optimizer's two paths (every
    # preset, mlp_offload's PFS path being the store), the store probed through object_store_tier;
    # strata's and mlp_offload's state really goes to the store (bytes written on path 1 > 0).
    # Small subgroups: strata places by the probed rates, and a store just started may write at
    # a twentieth of the directory's cap; 60 subgroups still give it some.
    add_test(NAME strata_bench_step_s3_path_beside_a_directory
             COMMAND ${CMAKE_COMMAND} -DENV_FILE=${strata_s3_env} -DSCRATCH=${strata_s3_run}/step -DNAME=step
                     -DFOREIGN=user-notes.txt -DGONE=${strata_s3_run}/step/nvme -DEXPECT_FILE=${strata_s3_run}/step/step.json
                     "-DEXPECT_OUTPUT=path s3 = s3://[^\n]+: cap 0.30/0.20 GB/s, probe \\(16 MiB\\) read [0-9.]+, write [0-9.]+ GB/s[^\n]*\n    probe's object store: [^\n]+ 0 patches.*\nstrata  "
                     "-DEXPECT_FILE_OUTPUT=\"preset\": \"mlp_offload\", \"setup_s\"[^{]*\"iterations\": \\[{[^}]*\"path_bytes_written\": \\[[0-9]+, [1-9][0-9]*\\].*\"preset\": \"strata\", \"setup_s\"[^{]*\"iterations\": \\[{[^}]*\"path_bytes_written\": \\[[0-9]+, [1-9][0-9]*\\]"
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/s3_command.cmake --
                     $<TARGET_FILE:strata_bench> step --compare --params 3M --subgroup 50K --threads 2 --iters 1
                     --warmup 1 --probe 16MiB --path @SCRATCH@/nvme:400MB --path s3://@BUCKET@/@PREFIX@:300MB:200MB
                     --json @SCRATCH@/step.json)
    # An object store as the first path (zero_infinity's only one, fp32 gradients through it).
    add_test(NAME strata_bench_step_s3_first_path_carries_zero_infinitys_gradients
             COMMAND ${CMAKE_COMMAND} -DENV_FILE=${strata_s3_env} -DSCRATCH=${strata_s3_run}/step-first -DNAME=step-first
                     "-DEXPECT_OUTPUT=\nzero_infinity +[^\n]* [0-9.]+/(0\\.0[1-9]|0\\.[1-9]|[1-9])"
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/s3_command.cmake --
                     $<TARGET_FILE:strata_bench> step --preset zero_infinity --params 3M --subgroup 1M --threads 2
                     --iters 1 --warmup 0 --probe 0 --path s3://@BUCKET@/@PREFIX@)
    list(APPEND strata_s3_tool_tests strata_bench_io_s3_reports_rates_and_tier_counters_and_removes_its_objects
         strata_bench_io_s3_json_has_the_tier_counters strata_bench_step_s3_path_beside_a_directory
         strata_bench_step_s3_first_path_carries_zero_infinitys_gradients)
    set_tests_properties(strata_bench_io_s3_reports_rates_and_tier_counters_and_removes_its_objects
                         strata_bench_io_s3_json_has_the_tier_counters strata_bench_step_s3_path_beside_a_directory
                         strata_bench_step_s3_first_path_carries_zero_infinitys_gradients PROPERTIES LABELS "s3;bench")
    # Usage errors need no server: striping 1 MiB units onto a store would patch every object.
    add_test(NAME strata_bench_step_s3_rejects_compare_equal
             COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=2 "-DEXPECT_OUTPUT=strata-bench: step: --compare-equal stripes 1 MiB units"
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake -- $<TARGET_FILE:strata_bench> step --compare
                     --compare-equal --path /tmp/x --path s3://strata/x)
    add_test(NAME strata_bench_io_s3_rejects_directory_options
             COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=2
                     "-DEXPECT_OUTPUT=strata-bench: io: --block is for a directory; it does not apply to an object store"
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake -- $<TARGET_FILE:strata_bench> io
                     --path s3://strata/x --block 1MiB)
    set_tests_properties(strata_bench_step_s3_rejects_compare_equal strata_bench_io_s3_rejects_directory_options
                         PROPERTIES LABELS "s3;bench")
    # A store that takes connections and never answers: io fails with one line naming the listing,
    # the endpoint and what timed out, within the configured request_deadline (4 s) and far within
    # the TIMEOUT below (each attempt used to wait out a 60 s stall timer, seven attempts in all).
    add_test(NAME strata_bench_io_s3_fails_within_its_deadline_on_a_silent_endpoint
             COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/silent_endpoint.py --expect-rc 1
                     "--expect-output=^strata-bench io: S3 LIST s3://strata/silent-io/ at http://127\\.0\\.0\\.1:[0-9]+: no response: request_deadline 4 s ran out \\(it bounds all attempts together\\): .*first_byte_timeout.*, after [0-9]+ attempts\n?$"
                     -- $<TARGET_FILE:strata_bench> io --path s3://strata/silent-io --size 8MiB --object 8MiB
                     --reps 1)
    set_tests_properties(strata_bench_io_s3_fails_within_its_deadline_on_a_silent_endpoint PROPERTIES
                         ENVIRONMENT "STRATA_S3_FIRST_BYTE_TIMEOUT=1;STRATA_S3_REQUEST_DEADLINE=4" TIMEOUT 60)
    # Settings refused before any request (the endpoint, port 1, refuses connections anyway): an
    # empty AWS_* variable, and a prefix with '..' segments that a server would resolve.
    add_test(NAME strata_bench_io_s3_refuses_an_empty_aws_region
             COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=2
                     "-DEXPECT_OUTPUT=^strata-bench: environment variable AWS_REGION is set but empty: unset it or give a value\n$"
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake -- $<TARGET_FILE:strata_bench> io
                     --path s3://strata/x --size 8MiB --object 8MiB --reps 1)
    add_test(NAME strata_bench_io_s3_refuses_a_prefix_with_dot_dot_segments
             COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=2
                     "-DEXPECT_OUTPUT=^strata-bench: io: --path: 's3://strata/\\.\\./\\.\\./etc': key prefix '\\.\\./\\.\\./etc' has a '\\.\\.' segment"
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake -- $<TARGET_FILE:strata_bench> io
                     --path s3://strata/../../etc --size 8MiB --object 8MiB --reps 1)
    set_tests_properties(strata_bench_io_s3_refuses_an_empty_aws_region
                         strata_bench_io_s3_refuses_a_prefix_with_dot_dot_segments PROPERTIES
                         ENVIRONMENT "AWS_REGION=;AWS_ENDPOINT_URL=http://127.0.0.1:1;AWS_ACCESS_KEY_ID=k;AWS_SECRET_ACCESS_KEY=s"
                         TIMEOUT 60)
    set_tests_properties(strata_bench_io_s3_fails_within_its_deadline_on_a_silent_endpoint
                         strata_bench_io_s3_refuses_an_empty_aws_region
                         strata_bench_io_s3_refuses_a_prefix_with_dot_dot_segments PROPERTIES LABELS "s3;bench;reliability")
  endif()

  if(STRATA_BUILD_EXAMPLES)
    # offload_demo over a directory and a store (the issue's s3://bucket/prefix:READ:WRITE form):
    # bytes per path, and afterwards neither the state nor the directory it made.
    add_test(NAME strata_example_offload_demo_s3_path_beside_a_directory
             COMMAND ${CMAKE_COMMAND} -DENV_FILE=${strata_s3_env} -DSCRATCH=${strata_s3_run}/demo -DNAME=demo
                     -DFOREIGN=user-notes.txt -DGONE=${strata_s3_run}/demo/nvme
                     "-DEXPECT_OUTPUT=  path s3://[^\n]+: read [^\n]+ \\(declared 1.00 / 0.50 GB/s\\)\n.*path s3://[^:]+: [0-9]+ bytes read, [1-9][0-9]* bytes written in all"
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/s3_command.cmake --
                     $<TARGET_FILE:offload_demo> --params 2M --subgroup 500K --steps 2 --threads 2
                     --path @SCRATCH@/nvme --path s3://@BUCKET@/@PREFIX@:1GB:500MB)
    # A run kept with --keep (DIR@READ/WRITE form) leaves its objects under its claim, which marks
    # them strata's: the next run takes them over without --adopt-existing (of a larger model:
    # the kept run's extra objects go too), and removes everything when done. (Objects that no
    # claim covers are refused: strata_s3_object_store_claim_test.)
    add_test(NAME strata_example_offload_demo_s3_takes_over_a_kept_runs_prefix
             COMMAND ${CMAKE_COMMAND} -DENV_FILE=${strata_s3_env} -DSCRATCH=${strata_s3_run}/demo-used -DNAME=demo-used
                     -DFOREIGN=user-notes.txt
                     "-DEXPECT_OUTPUT=path s3://[^:]+: [0-9]+ bytes read, [1-9][0-9]* bytes written in all"
                     "-DEXPECT_OUTPUT_2=path s3://[^:]+: [0-9]+ bytes read, [1-9][0-9]* bytes written in all"
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/s3_command.cmake --
                     $<TARGET_FILE:offload_demo> --params 2M --subgroup 250K --steps 1 --threads 2 --keep
                     --path s3://@BUCKET@/@PREFIX@@2GB/1GB
                     --then $<TARGET_FILE:offload_demo> --params 1M --subgroup 250K --steps 1 --threads 2
                     --path s3://@BUCKET@/@PREFIX@)
    # The kill loop of demo_kill_loop.cmake over a directory and a prefix of the store: every
    # run after a SIGKILL starts by itself, and a clean run leaves both as they were.
    add_test(NAME strata_offload_demo_s3_restarts_by_itself_after_kills
             COMMAND ${CMAKE_COMMAND} -DDEMO=$<TARGET_FILE:offload_demo> -DENV_FILE=${strata_s3_env}
                     -DDIR=${strata_s3_run}/kill-loop -DKILLS=30 -P ${CMAKE_CURRENT_SOURCE_DIR}/demo_s3_kill_loop.cmake)
    set_tests_properties(strata_offload_demo_s3_restarts_by_itself_after_kills PROPERTIES LABELS "reliability;s3")
    # README's examples/object_store.cpp: a directory and a store under one multipath, then a
    # checkpoint saved into the store and loaded back.
    add_test(NAME strata_example_object_store_runs
             COMMAND ${CMAKE_COMMAND} -DENV_FILE=${strata_s3_env} -DSCRATCH=${strata_s3_run}/object-store
                     -DNAME=object-store -DFOREIGN=user-notes.txt -DGONE=${strata_s3_run}/object-store/nvme
                     "-DEXPECT_OUTPUT=nvme holds [^\n]+, s3://[^ ]+ holds [^\n]+; intact: yes\ncheckpoint of step 1 in s3://[^:]+: 6 objects, loaded back at step 1"
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/s3_command.cmake --
                     $<TARGET_FILE:object_store> s3://@BUCKET@/@PREFIX@ @SCRATCH@/nvme)
    list(APPEND strata_s3_tool_tests strata_example_offload_demo_s3_path_beside_a_directory
         strata_example_offload_demo_s3_takes_over_a_kept_runs_prefix strata_example_object_store_runs
         strata_offload_demo_s3_restarts_by_itself_after_kills)
    set_tests_properties(strata_example_offload_demo_s3_path_beside_a_directory
                         strata_example_offload_demo_s3_takes_over_a_kept_runs_prefix
                         strata_example_object_store_runs
                         PROPERTIES LABELS "s3;example")
  endif()

  if(strata_s3_tool_tests)
    set_tests_properties(${strata_s3_tool_tests} PROPERTIES FIXTURES_REQUIRED strata_s3_server
                         SKIP_REGULAR_EXPRESSION "strata-s3-skip:" TIMEOUT 300)
  endif()
endif()

# Runs of examples/quickstart and examples/train_mlp (short settings).
# expect_exit.cmake checks the exit code and the output together (PASS_REGULAR_EXPRESSION alone
# would ignore the exit code, which train_mlp uses to report a loss that did not fall).
set(strata_examples_dir ${CMAKE_CURRENT_BINARY_DIR}/examples-run)

# quickstart: four steps over two directories; from step 2 on the host cache serves some subgroups.
add_test(NAME strata_example_quickstart_runs
         COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=0 "-DEXPECT_OUTPUT=step 4: 8 subgroups.*hits [1-9]" -P
                 ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake -- $<TARGET_FILE:quickstart>
                 ${strata_examples_dir}/quickstart/nvme ${strata_examples_dir}/quickstart/pfs)

# train_mlp: the loss falls (else exit 1) and the offloaded run ends bit-identical to the in-memory one.
add_test(NAME strata_example_train_mlp_runs
         COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=0 "-DEXPECT_OUTPUT=epoch 4: loss .*bit-identical to in-memory AdamW: yes"
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake -- $<TARGET_FILE:train_mlp> --samples 512 --epochs 4
                 --threads 2 --path ${strata_examples_dir}/train_mlp/a --path ${strata_examples_dir}/train_mlp/b)
string(JOIN ".*" strata_train_mlp_options --layers --hidden --inputs --outputs --samples --batch --epochs --lr
       --weight-decay --subgroup --cache --path --threads --seed --keep --help)
add_test(NAME strata_example_train_mlp_lists_options
         COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=0 "-DEXPECT_OUTPUT=${strata_train_mlp_options}" -P
                 ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake -- $<TARGET_FILE:train_mlp> --help)
# Usage errors: exit code 2 and exactly one line ('.' is its newline).
add_test(NAME strata_example_train_mlp_rejects_unknown_option
         COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=2 "-DEXPECT_OUTPUT=^train_mlp: unknown option --epoch \\(see --help\\).$"
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake -- $<TARGET_FILE:train_mlp> --epoch 3)
add_test(NAME strata_example_train_mlp_rejects_bad_number
         COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=2 "-DEXPECT_OUTPUT=^train_mlp: --batch: invalid count \"6x4\"[^\n]*.$"
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake -- $<TARGET_FILE:train_mlp> --batch 6x4)

# train_mlp_cuda (built with CUDA only): exit code 0 says the loss fell and the offloaded run
# (gradients and weights in device memory, updates on the CPU and the GPU) ended bit-identical to
# the in-memory one; it exits 77 (Skipped) without a usable GPU, so it runs without expect_exit.
if(STRATA_CUDA_LANGUAGE)
  add_test(NAME strata_example_train_mlp_cuda_runs
           COMMAND train_mlp_cuda --samples 512 --epochs 4 --threads 2 --site alternating
                   --path ${strata_examples_dir}/train_mlp_cuda/a --path ${strata_examples_dir}/train_mlp_cuda/b)
  set_tests_properties(strata_example_train_mlp_cuda_runs PROPERTIES LABELS "cuda;example" SKIP_RETURN_CODE 77)
  # Usage errors come before the GPU is looked for: exit code 2 and one line, with or without one.
  add_test(NAME strata_example_train_mlp_cuda_rejects_bad_site
           COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=2
                   "-DEXPECT_OUTPUT=^train_mlp_cuda: --site is 'gpu'; expected host, device or alternating.$" -P
                   ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake -- $<TARGET_FILE:train_mlp_cuda> --site gpu)
  set_tests_properties(strata_example_train_mlp_cuda_rejects_bad_site PROPERTIES LABELS example)
endif()

# custom_pipeline: an optimizer of its own over the pipeline; exits 1 when its weights are off.
add_test(NAME strata_example_custom_pipeline_runs
         COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=0 "-DEXPECT_OUTPUT=step 2: 8 updated, 3 cache hits.*expected"
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake -- $<TARGET_FILE:custom_pipeline>
                 ${strata_examples_dir}/custom_pipeline)

# docs/extending.md: a tier, an eviction policy and a C front written outside the library, each
# plugged into the optimizer; each program exits 1 when what its name says does not hold.
add_test(NAME strata_example_mmap_tier_state_is_bit_identical_to_host_memory
         COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=0 "-DEXPECT_OUTPUT=step 4: 8 subgroups.*bit-identical to host memory: yes"
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake -- $<TARGET_FILE:extending_mmap_tier>
                 ${strata_examples_dir}/mmap_tier)
add_test(NAME strata_example_mru_policy_hits_where_lru_does_not_and_state_is_bit_identical
         COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=0
                 "-DEXPECT_OUTPUT=mru: 0 [1-9].*lru: 0 0 0 0 0.*bit-identical to the default optimizer's: yes" -P
                 ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake -- $<TARGET_FILE:extending_mru_policy>)
add_test(NAME strata_example_lion_offload_is_bit_identical_to_its_flat_kernel_and_resumes
         COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=0
                 "-DEXPECT_OUTPUT=Lion state: exp_avg:f32 .8 bytes.*bit-identical to the flat kernel: yes; resumed, step 5: yes.*'lion'"
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake -- $<TARGET_FILE:extending_lion_offload>
                 ${strata_examples_dir}/lion_offload)
add_test(NAME strata_example_c_api_trains_and_resumes_bit_identically
         COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=0 "-DEXPECT_OUTPUT=step 5: loss.*step 7, bit-identical: yes"
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake -- $<TARGET_FILE:extending_c_api> train
                 ${strata_examples_dir}/c_api)
add_test(NAME strata_example_c_api_reports_errors_with_status_and_message
         COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=0
                 "-DEXPECT_OUTPUT=bad preset: status 1, .make_offloaded_adamw: unknown preset .*negative lr: status 1"
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake -- $<TARGET_FILE:extending_c_api> errors
                 ${strata_examples_dir}/c_api_errors)
set_tests_properties(strata_example_mmap_tier_state_is_bit_identical_to_host_memory
                     strata_example_mru_policy_hits_where_lru_does_not_and_state_is_bit_identical
                     strata_example_lion_offload_is_bit_identical_to_its_flat_kernel_and_resumes
                     strata_example_c_api_trains_and_resumes_bit_identically
                     strata_example_c_api_reports_errors_with_status_and_message PROPERTIES LABELS example)
# ... and from Python, through ctypes alone (no binding code). Not in sanitizer builds: a python3
# that was not linked with the sanitizer's runtime cannot load a library built with it.
if(NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  add_test(NAME strata_example_c_api_drives_the_optimizer_from_python_ctypes
           COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=0
                   "-DEXPECT_OUTPUT=3 steps from Python.*master weights: True.*bad preset: status 1" -P
                   ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake -- python3
                   ${PROJECT_SOURCE_DIR}/examples/extending/c_api_ctypes.py $<TARGET_FILE:strata_c>)
  set_tests_properties(strata_example_c_api_drives_the_optimizer_from_python_ctypes PROPERTIES LABELS example)
endif()

set_tests_properties(strata_example_custom_pipeline_runs strata_example_quickstart_runs strata_example_train_mlp_runs strata_example_train_mlp_lists_options
                     strata_example_train_mlp_rejects_unknown_option strata_example_train_mlp_rejects_bad_number
                     PROPERTIES LABELS example)

# mpi_train (built when MPI is found): ranks agree bit for bit, the node limiter's cap holds across
# ranks, a killed rank fails the job and the job resumes from its last checkpoint.
# (examples/ is configured after tests/, so ask for MPI here as examples/CMakeLists.txt does.)
find_package(MPI COMPONENTS CXX QUIET)
if(MPI_CXX_FOUND)
  if(MPIEXEC_EXECUTABLE)
    add_test(NAME strata_example_mpi_train_ranks_agree_limiter_holds_and_restart_works
             COMMAND ${CMAKE_COMMAND} -DMPIEXEC=${MPIEXEC_EXECUTABLE} -DMPI_TRAIN=$<TARGET_FILE:mpi_train>
                     -DWORK=${strata_examples_dir}/mpi_train -P ${CMAKE_CURRENT_SOURCE_DIR}/mpi_train.cmake)
    set_tests_properties(strata_example_mpi_train_ranks_agree_limiter_holds_and_restart_works
                         PROPERTIES LABELS "example;multiprocess;mpi" TIMEOUT 600)
    add_test(NAME strata_example_mpi_train_resume_checks_settings_and_checkpoint_path
             COMMAND ${CMAKE_COMMAND} -DMPIEXEC=${MPIEXEC_EXECUTABLE} -DMPI_TRAIN=$<TARGET_FILE:mpi_train>
                     -DWORK=${strata_examples_dir}/mpi_train_settings -DPART=settings
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/mpi_train.cmake)
    set_tests_properties(strata_example_mpi_train_resume_checks_settings_and_checkpoint_path
                         PROPERTIES LABELS "example;multiprocess;mpi;reliability" TIMEOUT 600)
    # The scaling benchmark's script, on a tiny model: one table row per switch cost and rank count.
    add_test(NAME strata_bench_mpi_scaling_script_prints_its_table
             COMMAND bash -c "set -o pipefail; rm -rf \"$3\"; \"$0\" --mpirun \"$1\" --mpi-train \"$2\" --dir \"$3\" \
                              --ranks '1 2' --switch-costs '0 500' --repeat 1 -- --hidden 64 --layers 2 \
                              | tee /dev/stderr | grep -c '^| [0-9]* us | [12] | [0-9.]* / [0-9.]* | [0-9.]* / [0-9.]* | [0-9.]*x |$' \
                              | grep -qx 4"
                     ${PROJECT_SOURCE_DIR}/bench/scripts/mpi_scaling.sh ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:mpi_train>
                     ${strata_examples_dir}/mpi_scaling)
    set_tests_properties(strata_bench_mpi_scaling_script_prints_its_table PROPERTIES LABELS "example;multiprocess;mpi"
                         TIMEOUT 600 ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:abort_on_error=1")
  endif()
  add_test(NAME strata_example_mpi_train_rejects_one_path
           COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=2 "-DEXPECT_OUTPUT=^mpi_train: give --path twice"
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake -- $<TARGET_FILE:mpi_train> --path /tmp/x)
  # Its paths go through the library's parser: an object store or a URL is refused by name (this
  # tool keeps directories), never taken for a folder "s3:"; an empty path is named, not a
  # filesystem error.
  foreach(case "object_store_path|--path s3://strata/mpq: this tool keeps its state in directories|--path;s3://strata/mpq;--path;s3://strata/mpr"
               "object_store_checkpoint|--checkpoint s3://strata/x: this tool keeps its state in directories|--path;p/a;--path;p/b;--checkpoint;s3://strata/x"
               "malformed_url|--path: 's3:/x' is not an object store URL|--path;s3:/x;--path;p/b")
    string(REPLACE "|" ";" parts "${case}")
    list(GET parts 0 name)
    list(GET parts 1 regex)
    list(SUBLIST parts 2 -1 args)
    string(REPLACE ";" "\\;" args "${args}")
    add_test(NAME strata_example_mpi_train_refuses_${name}_and_makes_no_folder
             COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=2 "-DEXPECT_OUTPUT=^mpi_train: ${regex}" -DEXPECT_NO_FILE=${CMAKE_CURRENT_BINARY_DIR}/s3:
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake -- $<TARGET_FILE:mpi_train> ${args})
    set_tests_properties(strata_example_mpi_train_refuses_${name}_and_makes_no_folder PROPERTIES
                         LABELS "example;mpi;reliability" WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}
                         ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:abort_on_error=1")
  endforeach()
  add_test(NAME strata_example_mpi_train_names_an_empty_path  # (an empty argument survives only through a shell)
           COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=2 "-DEXPECT_OUTPUT=^mpi_train: --path: the path is empty" -P
                   ${CMAKE_CURRENT_SOURCE_DIR}/expect_exit.cmake -- sh -c "$<TARGET_FILE:mpi_train> --path '' --path x")
  set_tests_properties(strata_example_mpi_train_names_an_empty_path PROPERTIES LABELS "example;mpi;reliability"
                       ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:abort_on_error=1")
  # OpenMPI leaks at MPI_Finalize in components it unloaded: no leak check for MPI processes under
  # the ASan preset (the same model code runs leak-checked in train_mlp).
  set_tests_properties(strata_example_mpi_train_rejects_one_path PROPERTIES LABELS "example;mpi"
                       ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:abort_on_error=1")
endif()

# mpi_train under mpirun: 1, 2 and 4 ranks end with bit-identical weights; the node limiter of the
# shared path never has more holders than --io-limit across the ranks, for reads and for writes
# (from every rank's permit log); a rank killed in the middle of a step fails the job with a clear message, and a restart
# from the last checkpoint ends with the weights of the uninterrupted run; a restart with another
# rank count is refused.
#   cmake -DMPIEXEC=<mpirun> -DMPI_TRAIN=<mpi_train> -DWORK=<dir> -P mpi_train.cmake
# With -DPART=settings, instead: a resume with other training settings is refused, naming each with
# both values, unless --allow-change names it (settings the checkpoint fixes are refused even so);
# a --checkpoint path that cannot be created is refused before training starts.
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
# Root is allowed in CI containers; single-copy (CMA) needs ptrace rights that containers lack.
set(ENV{OMPI_ALLOW_RUN_AS_ROOT} 1)
set(ENV{OMPI_ALLOW_RUN_AS_ROOT_CONFIRM} 1)
set(ENV{OMPI_MCA_btl_vader_single_copy_mechanism} none)
set(ENV{OMPI_MCA_rmaps_base_oversubscribe} 1)
# Under the ASan preset: OpenMPI leaks its own allocations at MPI_Finalize (in components it has
# unloaded, so a suppression cannot name them); leaks of strata's code are checked by every other
# test, including train_mlp, which runs the same model code without MPI.
if(DEFINED ENV{ASAN_OPTIONS})
  set(ENV{ASAN_OPTIONS} "$ENV{ASAN_OPTIONS}:detect_leaks=0")
else()
  set(ENV{ASAN_OPTIONS} "detect_leaks=0")
endif()
set(model --samples 512 --batch 64 --epochs 3 --hidden 64 --threads 1 --chunks 4)

function(run_job ranks name expect_rc)
  execute_process(COMMAND ${MPIEXEC} -np ${ranks} --oversubscribe --bind-to none ${MPI_TRAIN} ${model}
                          --path ${WORK}/${name}/local --path ${WORK}/${name}/shared ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(out "${out}" PARENT_SCOPE)
  set(err "${err}" PARENT_SCOPE)
  if(expect_rc STREQUAL "fail")
    if(rc EQUAL 0)
      message(FATAL_ERROR "${name}: expected a failure, got exit code 0\nstdout: ${out}\nstderr: ${err}")
    endif()
  elseif(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name}: exit code ${rc}\nstdout: ${out}\nstderr: ${err}")
  endif()
endfunction()

function(checksum_of text var)
  if(NOT text MATCHES "final weights' checksum ([0-9a-f]+)")
    message(FATAL_ERROR "no final checksum in:\n${text}")
  endif()
  set(${var} ${CMAKE_MATCH_1} PARENT_SCOPE)
endfunction()

if(PART STREQUAL "settings")
  function(expect_in text regex what)
    if(NOT "${text}" MATCHES "${regex}")
      message(FATAL_ERROR "${what}: output does not match '${regex}':\n${text}")
    endif()
  endfunction()
  set(ckpt --checkpoint ${WORK}/settings/ckpt)
  # One epoch of 8 steps, checkpointed at its end.
  run_job(1 settings 0 --epochs 1 ${ckpt})
  file(READ ${WORK}/settings/ckpt/LATEST latest)
  if(NOT latest MATCHES "^step-8")
    message(FATAL_ERROR "LATEST is '${latest}', expected step-8")
  endif()
  # Another --lr: refused, both values named, before any training.
  run_job(1 settings fail --epochs 1 --lr 0.02 ${ckpt} --resume)
  expect_in("${out}${err}" "--lr: 0.01 in the checkpoint, 0.02 now" "resume with another --lr")
  expect_in("${out}${err}" "--allow-change lr to train on" "resume with another --lr")
  if("${out}" MATCHES "epoch [0-9]+: loss")
    message(FATAL_ERROR "a refused resume trained:\n${out}")
  endif()
  # Two changed settings: one line each.
  run_job(1 settings fail --epochs 2 --lr 0.02 ${ckpt} --resume)
  expect_in("${out}${err}" "\n  --epochs: 1 in the checkpoint, 2 now\n  --lr: 0.01 in the checkpoint, 0.02 now\n"
            "resume with another --epochs and --lr")
  # The weight decay lives in the optimizer's checkpoint: refused even with --allow-change.
  run_job(1 settings fail --epochs 1 --weight-decay 0.001 --allow-change lr ${ckpt} --resume)
  expect_in("${out}${err}" "--weight-decay: 0.0001 in the checkpoint, 0.001 now \\(cannot change"
            "resume with another --weight-decay")
  run_job(1 settings fail --epochs 1 --allow-change weight-decay ${ckpt} --resume)
  expect_in("${out}${err}" "--allow-change: weight-decay cannot change on a resume" "--allow-change weight-decay")
  # Allowed: it trains on from step 8 with the new values, and says so.
  run_job(1 settings 0 --epochs 2 --lr 0.02 --allow-change lr,epochs ${ckpt} --resume)
  expect_in("${out}" "resumed from step 8, changing --epochs from 1 to 2, --lr from 0.01 to 0.02"
            "resume with --allow-change")
  expect_in("${out}" "epoch 2: loss" "resume with --allow-change")
  # The new checkpoint records the new values: resuming it with them needs no --allow-change.
  file(READ ${WORK}/settings/ckpt/LATEST latest)
  file(READ ${WORK}/settings/ckpt/step-16/job.manifest manifest)
  expect_in("${latest}" "^step-16" "LATEST after the changed resume")
  expect_in("${manifest}" "\nlr 0.02\n" "the manifest after the changed resume")
  # A --checkpoint under a regular file cannot be created: refused before any data or state is made.
  file(WRITE ${WORK}/settings/not-a-directory "")
  run_job(1 badckpt fail --checkpoint ${WORK}/settings/not-a-directory/ckpt)
  expect_in("${out}${err}" "mpi_train: --checkpoint: mkdir [^\n]*not-a-directory/ckpt: " "a bad --checkpoint")
  if("${out}" MATCHES "epoch [0-9]+: loss|parameters, bf16")
    message(FATAL_ERROR "training started with a bad --checkpoint:\n${out}")
  endif()
  if(EXISTS ${WORK}/badckpt/local/rank-0 OR EXISTS ${WORK}/badckpt/shared/rank-0)
    message(FATAL_ERROR "state directories were made before the bad --checkpoint was refused")
  endif()
  message(STATUS "resume settings: refused with their values, accepted with --allow-change; bad --checkpoint refused")
  return()
endif()

# 1. One, two and four ranks: the same final weights, and the loss fell (exit code 0). Two and four
# ranks go over emulated node links (shared by the ranks, across processes), which only delay.
set(links --shared-cap 200MB --local-cap 400MB --switch-cost 200 --link-chunk 16KiB)
foreach(ranks 1 2 4)
  if(ranks EQUAL 1)
    run_job(${ranks} ranks${ranks} 0 --io-limit 1 --io-log ${WORK}/ranks${ranks}.log)
  else()
    run_job(${ranks} ranks${ranks} 0 --io-limit 1 --io-log ${WORK}/ranks${ranks}.log ${links})
  endif()
  checksum_of("${out}" sum${ranks})
  message(STATUS "${ranks} ranks: ${sum${ranks}}")
endforeach()
if(NOT sum1 STREQUAL sum2 OR NOT sum1 STREQUAL sum4)
  message(FATAL_ERROR "final weights differ: 1 rank ${sum1}, 2 ranks ${sum2}, 4 ranks ${sum4}")
endif()

# 2. The limiter's cap across the 4 ranks: merge their permit logs, count holders over time.
set(events "")
file(GLOB logs "${WORK}/ranks4.log.rank-*")
list(LENGTH logs n_logs)
if(NOT n_logs EQUAL 4)
  message(FATAL_ERROR "expected 4 permit logs, found ${n_logs}: ${logs}")
endif()
foreach(log ${logs})
  file(STRINGS "${log}" lines)
  list(APPEND events ${lines})
endforeach()
list(LENGTH events n_events)
if(n_events LESS 8)
  message(FATAL_ERROR "only ${n_events} permit events: the shared path was not used")
endif()
# Per gate (r: reads, w: writes), sort by time (zero-padded so that text order is numeric order),
# then run the count.
foreach(gate r w)
  set(keyed "")
  foreach(e ${events})
    string(REPLACE " " ";" parts "${e}")
    list(GET parts 0 ns)
    list(GET parts 1 d)
    list(GET parts 2 g)
    if(NOT g STREQUAL gate)
      continue()
    endif()
    string(LENGTH "${ns}" len)
    math(EXPR pad "24 - ${len}")
    string(REPEAT "0" ${pad} zeros)
    # At one instant a release (-1) sorts before a grant (+1): "0" < "1".
    if(d EQUAL -1)
      list(APPEND keyed "${zeros}${ns}:0")
    else()
      list(APPEND keyed "${zeros}${ns}:1")
    endif()
  endforeach()
  list(SORT keyed)
  list(LENGTH keyed n_gate)
  set(holders 0)
  set(most 0)
  foreach(k ${keyed})
    if(k MATCHES ":1$")
      math(EXPR holders "${holders} + 1")
    else()
      math(EXPR holders "${holders} - 1")
    endif()
    if(holders GREATER most)
      set(most ${holders})
    endif()
  endforeach()
  if(most GREATER 1 OR most LESS 1 OR NOT holders EQUAL 0)
    message(FATAL_ERROR "gate ${gate} of the shared path had up to ${most} holders at once (cap 1), ${holders} left at the end")
  endif()
  message(STATUS "limiter, gate ${gate}: ${n_gate} events over 4 ranks, at most ${most} holder at once")
endforeach()

# 3. A rank killed in step 10 of a job checkpointing every 4 steps: the job fails and says so.
run_job(2 crash fail --checkpoint ${WORK}/crash/ckpt --checkpoint-every 4 --die-at 10 --die-rank 1 ${links})
if(NOT "${out}${err}" MATCHES "rank 1: killing itself in step 10")
  message(FATAL_ERROR "the crash was not reported:\nstdout: ${out}\nstderr: ${err}")
endif()
if(NOT "${out}${err}" MATCHES "signal 9|Killed|killed")
  message(FATAL_ERROR "mpirun did not report the killed rank:\nstdout: ${out}\nstderr: ${err}")
endif()
file(READ ${WORK}/crash/ckpt/LATEST latest)
if(NOT latest MATCHES "^step-8")
  message(FATAL_ERROR "LATEST is '${latest}', expected step-8")
endif()
# Another rank count cannot resume it.
run_job(4 crash fail --checkpoint ${WORK}/crash/ckpt --resume)
if(NOT "${out}${err}" MATCHES "saved by 2 ranks")
  message(FATAL_ERROR "a resume with 4 ranks was not refused clearly:\nstdout: ${out}\nstderr: ${err}")
endif()
# The same count resumes from step 8 and ends where the uninterrupted 2-rank job did.
run_job(2 crash 0 --checkpoint ${WORK}/crash/ckpt --resume)
if(NOT out MATCHES "resumed from step 8")
  message(FATAL_ERROR "did not resume from step 8:\n${out}")
endif()
checksum_of("${out}" resumed)
if(NOT resumed STREQUAL sum2)
  message(FATAL_ERROR "resumed job ended with ${resumed}, the uninterrupted one with ${sum2}")
endif()
message(STATUS "crash at step 10, resumed from step 8: ${resumed} (uninterrupted: ${sum2})")

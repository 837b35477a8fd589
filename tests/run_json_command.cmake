# For scripts that check a command's --json output: runs the command after "--" (it writes ${JSON},
# whose directory is made first) and sets `out` to its standard output; a non-zero exit fails.
# ${JSON} and the files listed in `remove_first` are removed before the run.
include(${CMAKE_CURRENT_LIST_DIR}/command_after_dashes.cmake)
file(REMOVE "${JSON}" ${remove_first})
get_filename_component(json_dir "${JSON}" DIRECTORY)
file(MAKE_DIRECTORY "${json_dir}")  # strata-bench opens --json before it creates the paths
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "exit code ${rc}\nstdout: ${out}\nstderr: ${err}")
endif()

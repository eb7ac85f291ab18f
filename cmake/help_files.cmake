# Writes the files generated from the command line's own tables (engine/cli/help.c):
# the man page moonloop.1 and the bash and zsh completions, by running the
# binary just built. Usage: cmake -DBIN=path/to/moonloop -DOUT_DIR=dir -P help_files.cmake
foreach(pair "moonloop.1|help;--man" "moonloop.bash|help;--completion;bash"
             "_moonloop|help;--completion;zsh")
  string(REPLACE "|" ";" parts "${pair}")
  list(GET parts 0 name)
  list(SUBLIST parts 1 -1 args)
  execute_process(COMMAND ${BIN} ${args} OUTPUT_FILE ${OUT_DIR}/${name}.tmp RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "moonloop ${args} failed (${rc})")
  endif()
  file(RENAME ${OUT_DIR}/${name}.tmp ${OUT_DIR}/${name})
endforeach()

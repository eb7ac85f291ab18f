# Installs moonloop.service (from dist/moonloop.service.in) with the paths of
# this install: the prefix is known only now (`cmake --install --prefix`).
# Run by `cmake --install` after install(CODE) set ML_SRC, ML_BUILD,
# ML_BINDIR, ML_SYSCONFDIR and ML_UNITDIR (relative to the prefix, or absolute).
foreach(v ML_BINDIR ML_SYSCONFDIR ML_UNITDIR)
  if(NOT IS_ABSOLUTE "${${v}}")
    set(${v} "${CMAKE_INSTALL_PREFIX}/${${v}}")
  endif()
endforeach()
set(MOONLOOP_BINDIR "${ML_BINDIR}")
set(MOONLOOP_SYSCONFDIR "${ML_SYSCONFDIR}")
configure_file("${ML_SRC}/dist/moonloop.service.in" "${ML_BUILD}/moonloop.service" @ONLY)
# (file(INSTALL) puts $DESTDIR in front of the destination itself.)
file(INSTALL "${ML_BUILD}/moonloop.service" DESTINATION "${ML_UNITDIR}")

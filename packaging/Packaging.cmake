# Packaging (issue 7): man pages, the documentation that goes into the .deb,
# and CPack. Included once at the end of the top-level CMakeLists.txt, after
# every install(TARGETS ...) rule, because include(CPack) snapshots them.
#
#   cmake --install BUILD [--prefix P]   binaries to P/bin, man pages to P/share/man/man8
#   cpack --config BUILD/CPackConfig.cmake -G DEB [-B OUTDIR]
#                                        mtcfs_<version>_<arch>.deb (prefix /usr)
#
# The documentation (README, docs/, the fstab/systemd examples) is in the
# "doc" component, excluded from a plain `cmake --install` (it is for the
# package; `cmake --install BUILD --component doc` installs it by hand).

include(GNUInstallDirs)

# ---- hardening of the shipped binaries: what Debian's dpkg-buildflags
# gives with hardening=+all (lintian checks each): stack protector,
# _FORTIFY_SOURCE=2 (needs -O1 or more: not in Debug, where glibc warns and
# -Werror fails; not under the sanitizers, which replace those checks), PIE,
# full RELRO (relro + bindnow). Applied to the layer libraries too: the
# binaries are mostly them. The .comment section (compiler idents, also from
# the C runtime's objects) is taken out after the link, as dh_strip does.
option(MTCFS_HARDEN "Build with Debian's hardening flags" ON)
if(MTCFS_HARDEN)
  set(_mtcfs_fortify $<$<NOT:$<OR:$<CONFIG:Debug>,$<BOOL:${MTCFS_SANITIZE}>,$<BOOL:${MTCFS_TSAN}>>>:-U_FORTIFY_SOURCE;-D_FORTIFY_SOURCE=2>)
  # the layer libraries (the binaries are mostly them) and every shipped
  # program; mtcfs-csi only where gRPC was found
  set(_mtcfs_shipped mtcfs mtcfs-admin)
  if(TARGET mtcfs-csi)
    list(APPEND _mtcfs_shipped mtcfs-csi)
  endif()
  foreach(_t ${MTCFS_LAYERS})
    target_compile_options(mtcfs_${_t} PRIVATE -fstack-protector-strong -fPIE
                           -Wformat -Werror=format-security "${_mtcfs_fortify}")
  endforeach()
  foreach(_t ${_mtcfs_shipped})
    target_compile_options(${_t} PRIVATE -fstack-protector-strong -fPIE
                           -Wformat -Werror=format-security "${_mtcfs_fortify}")
  endforeach()
  foreach(_t ${_mtcfs_shipped})
    target_link_options(${_t} PRIVATE -pie -Wl,-z,relro -Wl,-z,now)
    get_target_property(_dir ${_t} SOURCE_DIR)
    if(CMAKE_OBJCOPY AND _dir STREQUAL CMAKE_SOURCE_DIR)   # csi/ strips its own
      add_custom_command(TARGET ${_t} POST_BUILD
        COMMAND ${CMAKE_OBJCOPY} --remove-section=.comment $<TARGET_FILE:${_t}>
        VERBATIM)
    endif()
  endforeach()
endif()

# ---- man pages: gzip -9n like Debian's dh_installman (reproducible: no name
# or time stamp in the header); plain roff when gzip is missing.
set(MTCFS_MAN_PAGES mtcfs.8 mtcfs-admin.8)
find_program(MTCFS_GZIP gzip)
set(_mtcfs_man_out)
foreach(_m ${MTCFS_MAN_PAGES})
  set(_src ${CMAKE_CURRENT_LIST_DIR}/man/${_m})
  if(MTCFS_GZIP)
    set(_dst ${CMAKE_BINARY_DIR}/man/${_m}.gz)
    add_custom_command(OUTPUT ${_dst}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/man
      COMMAND ${CMAKE_COMMAND} -E copy ${_src} ${CMAKE_BINARY_DIR}/man/${_m}
      COMMAND ${MTCFS_GZIP} -9 -n -f ${CMAKE_BINARY_DIR}/man/${_m}
      DEPENDS ${_src}
      COMMENT "Compressing man page ${_m}"
      VERBATIM)
  else()
    set(_dst ${_src})
  endif()
  list(APPEND _mtcfs_man_out ${_dst})
endforeach()
add_custom_target(mtcfs-man ALL DEPENDS ${_mtcfs_man_out})
install(FILES ${_mtcfs_man_out} DESTINATION ${CMAKE_INSTALL_MANDIR}/man8)

# ---- Debian's changelog (a native package: changelog.gz) and copyright,
# package only. MTCFS_MAINTAINER names the package's Maintainer and the
# changelog's signer: set it to the address that answers for a release.
set(MTCFS_MAINTAINER "mtcfs maintainers <maintainers@users.noreply.a-seed-a6eb716d.example>"
    CACHE STRING "Maintainer of the .deb: Name <address>")
configure_file(${CMAKE_CURRENT_LIST_DIR}/debian/changelog.in
               ${CMAKE_BINARY_DIR}/debian/changelog @ONLY)
if(MTCFS_GZIP)
  add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/debian/changelog.gz
    COMMAND ${MTCFS_GZIP} -9 -n -c ${CMAKE_BINARY_DIR}/debian/changelog
            > ${CMAKE_BINARY_DIR}/debian/changelog.gz
    DEPENDS ${CMAKE_BINARY_DIR}/debian/changelog
    COMMENT "Compressing the Debian changelog")
  add_custom_target(mtcfs-changelog ALL DEPENDS ${CMAKE_BINARY_DIR}/debian/changelog.gz)
  install(FILES ${CMAKE_BINARY_DIR}/debian/changelog.gz
          DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT doc EXCLUDE_FROM_ALL)
endif()
install(FILES ${CMAKE_CURRENT_LIST_DIR}/debian/copyright
        DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT doc EXCLUDE_FROM_ALL)

# ---- documentation and examples, package only (component "doc")
install(FILES ${CMAKE_SOURCE_DIR}/README.md
              ${CMAKE_SOURCE_DIR}/docs/deploy.md
              ${CMAKE_SOURCE_DIR}/docs/gke-mapping.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT doc EXCLUDE_FROM_ALL)
install(FILES ${CMAKE_CURRENT_LIST_DIR}/systemd/fstab.example
              ${CMAKE_CURRENT_LIST_DIR}/systemd/var-lib-mtcfs-ram.mount
              ${CMAKE_CURRENT_LIST_DIR}/systemd/ckpt.mount
              ${CMAKE_CURRENT_LIST_DIR}/systemd/mtcfs-ckpt.service
              ${CMAKE_CURRENT_LIST_DIR}/systemd/60-mtcfs.conf
        DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples COMPONENT doc EXCLUDE_FROM_ALL)

# ---- libfuse for the package. Passthrough needs libfuse >= 3.17. Debian 13
# ships it (libfuse3-4); Debian 12 ships 3.14, and install-deps.sh builds
# trixie's 3.17 there, whose libfuse3-4 package bookworm's archive does not
# have: a .deb depending on it would not install on a stock Debian 12. So
# on a release without its own 3.17 the package carries that one library
# privately (/usr/lib/<triplet>/mtcfs/libfuse3.so.4, found through mtcfs's
# RUNPATH; libfuse is LGPL-2.1, linked dynamically and replaceable), and
# depends on nothing the release lacks. The Debian version names the
# release and the libfuse, so one name and version is always one build:
# 0.1.0+deb12 (3.17 carried), 0.1.0+deb12.fuse314 (no passthrough),
# 0.1.0+deb13 (the release's 3.17).
set(MTCFS_OS_ID "")
set(MTCFS_OS_VERSION_ID "")
if(EXISTS /etc/os-release)
  file(STRINGS /etc/os-release _osr REGEX "^(ID|VERSION_ID)=")
  foreach(_l ${_osr})
    if(_l MATCHES "^ID=\"?([a-z0-9]+)")
      set(MTCFS_OS_ID ${CMAKE_MATCH_1})
    elseif(_l MATCHES "^VERSION_ID=\"?([0-9]+)")
      set(MTCFS_OS_VERSION_ID ${CMAKE_MATCH_1})
    endif()
  endforeach()
endif()
set(_bundle_default OFF)
if(MTCFS_OS_ID STREQUAL "debian" AND MTCFS_OS_VERSION_ID AND MTCFS_OS_VERSION_ID LESS 13
   AND NOT FUSE3_VERSION VERSION_LESS 3.17)
  set(_bundle_default ON)
endif()
option(MTCFS_BUNDLE_LIBFUSE "Package the libfuse >= 3.17 mtcfs links (for a release without it)"
       ${_bundle_default})
set(MTCFS_DEB_VERSION ${PROJECT_VERSION})
if(MTCFS_OS_ID STREQUAL "debian" AND MTCFS_OS_VERSION_ID)
  string(APPEND MTCFS_DEB_VERSION "+deb${MTCFS_OS_VERSION_ID}")
  if(FUSE3_VERSION VERSION_LESS 3.17)
    string(REGEX REPLACE "^([0-9]+)\\.([0-9]+).*" "fuse\\1\\2" _fv ${FUSE3_VERSION})
    string(APPEND MTCFS_DEB_VERSION ".${_fv}")
  endif()
endif()
# lib/<triplet>/mtcfs whatever the prefix: Debian's place for a private
# library (and not a directory CPack would run ldconfig for)
if(CMAKE_LIBRARY_ARCHITECTURE)
  set(MTCFS_PRIVATE_LIBDIR lib/${CMAKE_LIBRARY_ARCHITECTURE}/mtcfs)
else()
  set(MTCFS_PRIVATE_LIBDIR lib/mtcfs)
endif()
if(MTCFS_BUNDLE_LIBFUSE)
  find_library(_fuse_so NAMES fuse3 HINTS ${FUSE3_LIBRARY_DIRS} NO_DEFAULT_PATH)
  if(NOT _fuse_so)
    find_library(_fuse_so NAMES fuse3)
  endif()
  get_filename_component(_fuse_real ${_fuse_so} REALPATH)
  execute_process(COMMAND readelf -d ${_fuse_real} OUTPUT_VARIABLE _fuse_dyn
                  RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0 OR NOT _fuse_dyn MATCHES "\\(SONAME\\)[^[]*\\[([^]]+)\\]")
    message(FATAL_ERROR "MTCFS_BUNDLE_LIBFUSE: cannot read the SONAME of ${_fuse_real}")
  endif()
  set(MTCFS_FUSE_SONAME ${CMAKE_MATCH_1})
  message(STATUS "package: carries ${_fuse_real} as ${MTCFS_PRIVATE_LIBDIR}/${MTCFS_FUSE_SONAME}")
  install(FILES ${_fuse_real} DESTINATION ${MTCFS_PRIVATE_LIBDIR}
          RENAME ${MTCFS_FUSE_SONAME}
          PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
  # relative to the binary, so that /usr (the package) and /usr/local
  # (cmake --install) both find it; the build tree keeps its own RPATH
  set_target_properties(mtcfs PROPERTIES
    INSTALL_RPATH "\$ORIGIN/../${MTCFS_PRIVATE_LIBDIR}")
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS
      "${MTCFS_PRIVATE_LIBDIR}")
endif()

# ---- CPack
set(CPACK_PACKAGE_NAME mtcfs)
set(CPACK_PACKAGE_VENDOR "mtcfs")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_DEBIAN_PACKAGE_VERSION ${MTCFS_DEB_VERSION})
set(CPACK_PACKAGE_CONTACT "${MTCFS_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "FUSE filesystem for multi-tier checkpointing of distributed training")
set(CPACK_PACKAGE_DESCRIPTION
"mtcfs keeps the checkpoints a training job writes into its mount in a RAM
tier, copies each committed step to peer nodes and, after a restart, hands
every node the last step that is complete across the job, through the same
replicator.yaml / .restore protocol as GKE's Multi-Tier Checkpointing
replicator, so MaxText/Orbax and the NeMo/PyTorch reference run unchanged.
This package contains the daemon mtcfs (mount -t fuse.mtcfs) and the
operator tool mtcfs-admin.")
set(CPACK_GENERATOR DEB)
set(CPACK_STRIP_FILES ON)
# Everything but the build tree's own test and benchmark programs: the
# default component (binaries, man pages) and the package-only "doc".
set(CPACK_INSTALL_CMAKE_PROJECTS
    "${CMAKE_BINARY_DIR};${PROJECT_NAME};Unspecified;/"
    "${CMAKE_BINARY_DIR};${PROJECT_NAME};doc;/")

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)          # mtcfs_0.1.0_amd64.deb
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# fuse3 is not a shared library the binaries link: it brings mount.fuse3
# (mount -t fuse.mtcfs, fstab) and fusermount3, so it is always declared.
# ca-certificates: gs:// goes over HTTPS, and libcurl only Recommends the
# CA bundle (apt --no-install-recommends, slim images).
set(CPACK_DEBIAN_PACKAGE_DEPENDS "fuse3, ca-certificates")
find_program(MTCFS_DPKG_SHLIBDEPS dpkg-shlibdeps)
find_program(MTCFS_FILE_CMD file)                # CPackDeb needs it for SHLIBDEPS
if(MTCFS_DPKG_SHLIBDEPS AND MTCFS_FILE_CMD)
  # dpkg-shlibdeps (dpkg-dev) reads the binaries' NEEDED entries and adds
  # exact package names and minimum versions: libc6, libfuse3-3, liblmdb0,
  # libyaml-0-2, libssl3, libisal2, libjansson4, libcurl4, libmicrohttpd12
  # (whatever the binaries link when they are packed).
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
else()
  # Debian 12 names; a superset of what the binaries link.
  string(APPEND CPACK_DEBIAN_PACKAGE_DEPENDS
    ", libc6 (>= 2.34), libfuse3-3 (>= 3.2), liblmdb0, libyaml-0-2, libssl3,"
    " libisal2, libjansson4, libcurl4, libmicrohttpd12")
endif()

include(CPack)

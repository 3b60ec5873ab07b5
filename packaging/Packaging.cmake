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

# ---- CPack
set(CPACK_PACKAGE_NAME mtcfs)
set(CPACK_PACKAGE_VENDOR "mtcfs")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
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
set(CPACK_DEBIAN_PACKAGE_DEPENDS "fuse3")
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

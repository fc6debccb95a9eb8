# Install rules: public headers, the static and shared libraries, the hkv CLI, the bundled model
# configs, a CMake package (hybridkvConfig.cmake with one export set per component) and
# pkg-config files. docs/install.md is the user's side of this file.
include(CMakePackageConfigHelpers)

set(HKV_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/hybridkv)
set(HKV_MODELS_INSTALL_DIR ${CMAKE_INSTALL_DATADIR}/hybridkv/models)

set(hkv_header_excludes)
if(NOT HKV_BUILD_CONNECTOR)
  list(APPEND hkv_header_excludes PATTERN connector EXCLUDE PATTERN engine EXCLUDE)
endif()
install(DIRECTORY include/hkv DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT devel
        FILES_MATCHING PATTERN "*.h" ${hkv_header_excludes})
install(DIRECTORY models/ DESTINATION ${HKV_MODELS_INSTALL_DIR} COMPONENT devel)

# Export sets, in dependency order; each becomes hybridkv-<set>-targets.cmake, loaded by the
# package config when its component is asked for.
set(hkv_installed_components)
foreach(set IN ITEMS core connector engine)
  get_property(targets GLOBAL PROPERTY HKV_EXPORT_${set})
  if(NOT targets)
    continue()
  endif()
  list(APPEND hkv_installed_components ${set})
  install(TARGETS ${targets} EXPORT hybridkv-${set}
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT devel
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime
                  NAMELINK_COMPONENT devel
          INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT hybridkv-${set} NAMESPACE hybridkv:: FILE hybridkv-${set}-targets.cmake
          DESTINATION ${HKV_CMAKE_INSTALL_DIR} COMPONENT devel)
endforeach()
if(HKV_BUILD_PYTHON AND NOT HKV_FUZZ)
  list(APPEND hkv_installed_components python)
endif()

if(NOT DEFINED HKV_PYTHON_INSTALL_DIR)
  set(HKV_PYTHON_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/python3/dist-packages)
endif()
configure_package_config_file(
  cmake/hybridkvConfig.cmake.in ${PROJECT_BINARY_DIR}/hybridkvConfig.cmake
  INSTALL_DESTINATION ${HKV_CMAKE_INSTALL_DIR}
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR HKV_MODELS_INSTALL_DIR HKV_PYTHON_INSTALL_DIR)
# Same minor version: the SONAME policy above (0.x minors may break the ABI).
write_basic_package_version_file(${PROJECT_BINARY_DIR}/hybridkvConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/hybridkvConfig.cmake
              ${PROJECT_BINARY_DIR}/hybridkvConfigVersion.cmake
        DESTINATION ${HKV_CMAKE_INSTALL_DIR} COMPONENT devel)

# pkg-config: hybridkv (the core parts) and, with the connector, hybridkv-engine. The prefix is
# found from the .pc file's own place, so an installed tree can be moved.
set(HKV_PC_LIBDIR ${CMAKE_INSTALL_LIBDIR})
set(HKV_PC_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR})
file(RELATIVE_PATH HKV_PC_PREFIX_FROM_PCDIR
     ${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" HKV_PC_PREFIX_FROM_PCDIR "${HKV_PC_PREFIX_FROM_PCDIR}")
configure_file(cmake/hybridkv.pc.in ${PROJECT_BINARY_DIR}/hybridkv.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/hybridkv.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT devel)
if(HKV_BUILD_CONNECTOR)
  configure_file(cmake/hybridkv-engine.pc.in ${PROJECT_BINARY_DIR}/hybridkv-engine.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/hybridkv-engine.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT devel)
endif()

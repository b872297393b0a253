# Installs and exports libzion_emu as the CMake package zion_emu:
#
#   find_package(Torch REQUIRED)      # CMAKE_PREFIX_PATH: torch.utils.cmake_prefix_path
#   find_package(zion_emu REQUIRED)   # zion_emu_DIR: <prefix>/lib/cmake/zion_emu or the build tree
#   target_link_libraries(app PRIVATE zion_emu::zion_emu)
#
# The build tree is a package too (zion_emuConfig.cmake beside libzion_emu.so),
# so a program can build against a checkout without an install step.

include(CMakePackageConfigHelpers)
include(GNUInstallDirs)

set(ZION_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/zion_emu)
set(ZION_PRESET_INSTALL_DIR ${CMAKE_INSTALL_DATADIR}/zion_emu/platforms)

install(TARGETS zion_emu EXPORT zion_emuTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY csrc/include/zion_emu DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# Found by zion_emu::set_platform relative to the installed library.
install(DIRECTORY zion_emu/platforms/ DESTINATION ${ZION_PRESET_INSTALL_DIR} FILES_MATCHING PATTERN "*.json")
install(EXPORT zion_emuTargets NAMESPACE zion_emu:: DESTINATION ${ZION_CMAKE_INSTALL_DIR})

# Torch_DIR of this build: the config looks there first for the same torch.
set(ZION_TORCH_DIR "${Torch_DIR}")
configure_package_config_file(cmake/zion_emuConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/cmake/zion_emuConfig.cmake
  INSTALL_DESTINATION ${ZION_CMAKE_INSTALL_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/zion_emuConfigVersion.cmake
  VERSION 0.1.0 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/cmake/zion_emuConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/zion_emuConfigVersion.cmake
        DESTINATION ${ZION_CMAKE_INSTALL_DIR})

# The build tree's package: the same config, its targets at their build paths,
# and the hardware model's static library zion_emu::zion_sim with the source
# tree's headers (for bench/cpp/collective_bench; not installed).
export(EXPORT zion_emuTargets NAMESPACE zion_emu:: FILE ${CMAKE_CURRENT_BINARY_DIR}/zion_emuTargets.cmake)
export(TARGETS zion_sim NAMESPACE zion_emu:: FILE ${CMAKE_CURRENT_BINARY_DIR}/zion_simTargets.cmake)
configure_file(${CMAKE_CURRENT_BINARY_DIR}/cmake/zion_emuConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/zion_emuConfig.cmake COPYONLY)

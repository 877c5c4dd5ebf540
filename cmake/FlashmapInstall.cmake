# `cmake --install <build> --prefix P`: P/bin/flashmap, the default pair under
# P/share/flashmap/models/default (where the binary looks for it, relative to itself: see
# default_pair_dir in src/cli/options.cpp), the public headers, the engine's static libraries and
# the CMake package: find_package(flashmap) gives flashmap::engine (the Engine of
# include/flashmap/engine.h) and flashmap::text (TextCodec, Tokenizer, ChatTemplate).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The binary finds its pair at <exe dir>/../share/flashmap, so these two are fixed rather than
# GNUInstallDirs' (a changed DATADIR would leave the binary without a default).
set(FLASHMAP_INSTALL_DATADIR share/flashmap)
set(FLASHMAP_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/flashmap)

install(TARGETS flashmap RUNTIME DESTINATION bin)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/models/default/target ${PROJECT_SOURCE_DIR}/models/default/draft
        DESTINATION ${FLASHMAP_INSTALL_DATADIR}/models/default)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/flashmap DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# Static libraries: a consumer links flashmap::engine and, through its link interface, every
# layer below it, so all of them are installed and exported (as flashmap::<layer>).
set(FLASHMAP_EXPORTED core paged io ops models specdec backend cpu engine text)
if(FLASHMAP_WITH_CUDA)
  list(APPEND FLASHMAP_EXPORTED cuda)
endif()
set(FLASHMAP_EXPORTED_TARGETS)
foreach(layer IN LISTS FLASHMAP_EXPORTED)
  set_target_properties(flashmap_${layer} PROPERTIES EXPORT_NAME ${layer})
  # The same names for a project that adds this tree with add_subdirectory.
  add_library(flashmap::${layer} ALIAS flashmap_${layer})
  list(APPEND FLASHMAP_EXPORTED_TARGETS flashmap_${layer})
endforeach()
install(TARGETS ${FLASHMAP_EXPORTED_TARGETS} EXPORT flashmapTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT flashmapTargets NAMESPACE flashmap:: DESTINATION ${FLASHMAP_INSTALL_CMAKEDIR})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/flashmapConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/cmake/flashmapConfig.cmake
                              INSTALL_DESTINATION ${FLASHMAP_INSTALL_CMAKEDIR}
                              PATH_VARS FLASHMAP_INSTALL_DATADIR)
# 0.x: a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/flashmapConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/flashmapConfig.cmake
              ${PROJECT_BINARY_DIR}/cmake/flashmapConfigVersion.cmake
        DESTINATION ${FLASHMAP_INSTALL_CMAKEDIR})

# The CUDA backend (kernels/cuda/): a static library `ptcuda`, its GPU test, and the plugin
# libpipetrain-cuda.so that pipetrain loads at run time (src/runtime/cuda_plugin.h).
# Included by the top-level CMakeLists.txt after the CPU targets. Only binaries that link
# ptcuda pay for CUDA (loading cuBLAS costs about 0.5 s per process start).
#
#   -DPT_CUDA=AUTO  (default) build it when a CUDA compiler is found
#   -DPT_CUDA=ON    build it; no toolkit is a configure error
#   -DPT_CUDA=OFF   skip it
# PT_HAVE_CUDA (a CMake variable here, a compile definition =1 for targets linking ptcuda)
# tells the rest of the build whether the backend exists.

set(PT_CUDA AUTO CACHE STRING "Build the CUDA backend (AUTO, ON, OFF)")
set_property(CACHE PT_CUDA PROPERTY STRINGS AUTO ON OFF)

string(TOUPPER "${PT_CUDA}" pt_cuda_mode)
if(pt_cuda_mode STREQUAL "AUTO")
elseif(pt_cuda_mode MATCHES "^(ON|YES|TRUE|Y|1)$")
  set(pt_cuda_mode ON)
elseif(pt_cuda_mode MATCHES "^(OFF|NO|FALSE|N|0)$")
  set(pt_cuda_mode OFF)
else()
  message(FATAL_ERROR "PT_CUDA must be AUTO, ON or OFF, not '${PT_CUDA}'")
endif()

set(PT_HAVE_CUDA OFF)
if(pt_cuda_mode STREQUAL "OFF")
  message(STATUS "  [ ] CUDA (off: -DPT_CUDA=OFF)")
else()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # A100 (sm_80) and H100/H200 (sm_90). Must be set before enable_language, which would
    # otherwise pick the compiler's default (an old architecture, JIT-compiled at start).
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "80;90")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit)
    # The plugin asks the driver for entry points by version (cudaGetDriverEntryPointByVersion).
    if(CUDAToolkit_FOUND AND CUDAToolkit_VERSION VERSION_LESS 12.5)
      set(pt_cuda_too_old "CUDA ${CUDAToolkit_VERSION} is older than 12.5")
    elseif(CUDAToolkit_FOUND)
      set(PT_HAVE_CUDA ON)
    endif()
  endif()
  if(PT_HAVE_CUDA)
    pt_report("CUDA" TRUE "${CMAKE_CUDA_COMPILER_VERSION} (nvcc ${CMAKE_CUDA_COMPILER}, \
architectures ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(pt_cuda_too_old)
    if(pt_cuda_mode STREQUAL "ON")
      message(FATAL_ERROR "PT_CUDA=ON but ${pt_cuda_too_old}: install CUDA 12.5 or newer")
    endif()
    message(STATUS "  [ ] CUDA (${pt_cuda_too_old}; the CUDA backend needs 12.5)")
  elseif(pt_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "PT_CUDA=ON but no CUDA toolkit was found (nvcc on the PATH or "
      "CMAKE_CUDA_COMPILER, e.g. /usr/local/cuda/bin/nvcc); use -DPT_CUDA=AUTO or OFF")
  else()
    message(STATUS "  [ ] CUDA (not found: no nvcc; the CUDA backend is not built)")
  endif()
endif()

if(PT_HAVE_CUDA)
  file(GLOB PT_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/cuda/*.cu)
  add_library(ptcuda STATIC ${PT_CUDA_SOURCES})
  # The shared runtime, as CUDA::cudart below (CMake's default would add the static one
  # as well to every CUDA link).
  set_target_properties(ptcuda PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
    CUDA_RUNTIME_LIBRARY Shared)
  target_link_libraries(ptcuda PUBLIC ptkernels CUDA::cudart CUDA::cublas CUDA::curand)
  target_compile_definitions(ptcuda PUBLIC PT_HAVE_CUDA=1)
  # The top-level's C flags are C-only ($<COMPILE_LANGUAGE:C>); the CUDA sources get their
  # own: host-compiler warnings, line tables for compute-sanitizer and ncu (no effect on
  # the code). The sanitizers are deliberately not passed to nvcc: ASan instrumentation of
  # CUDA host code needs a matching runtime setup and ASan cannot see device memory.
  set(pt_cuda_flags -Xcompiler=-Wall,-Wextra -lineinfo)
  if(PT_WERROR)
    list(APPEND pt_cuda_flags -Werror=all-warnings -Xcompiler=-Werror)
  endif()
  target_compile_options(ptcuda PRIVATE "$<$<COMPILE_LANGUAGE:CUDA>:${pt_cuda_flags}>")

  # The CUDA plugin (src/engine/cuda_abi.h): libpipetrain-cuda.so beside the pipetrain binary,
  # dlopen'ed for --device cuda and `pipetrain devices`, so that neither pipetrain nor any
  # test binary links cudart or cuBLAS. It holds src/cuda/*.c (entry, error forwarding,
  # CUDA engine) with the kernels and the engine layer (src/engine and below) they use, hence PIC for both.
  # Only pt_cuda_plugin_entry is exported: hidden visibility for its own objects and
  # --exclude-libs for the static libraries' (the plugin's copy of the engine layer must not interpose
  # on the host's). --no-undefined: a missing symbol is a link error here, not a dlopen
  # error at run time.
  set_target_properties(${PT_MODULES} ptcuda PROPERTIES POSITION_INDEPENDENT_CODE ON)
  file(GLOB PT_CUDA_PLUGIN_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/cuda/*.c)
  add_library(pipetrain_cuda MODULE ${PT_CUDA_PLUGIN_SOURCES})
  target_link_libraries(pipetrain_cuda PRIVATE ptcuda ptengine)
  set_target_properties(pipetrain_cuda PROPERTIES OUTPUT_NAME pipetrain-cuda PREFIX lib
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR} C_VISIBILITY_PRESET hidden
    CUDA_RUNTIME_LIBRARY Shared)
  target_link_options(pipetrain_cuda PRIVATE -Wl,--exclude-libs,ALL -Wl,--no-undefined)
  add_dependencies(pipetrain pipetrain_cuda)
  # The host's "plugin missing" message: this build makes one, so it was not built without.
  set_property(SOURCE ${CMAKE_SOURCE_DIR}/src/runtime/cuda_plugin.c APPEND PROPERTY
    COMPILE_DEFINITIONS PT_CUDA_PLUGIN_BUILT=1)

  if(PT_TESTS)
    # The CUDA engine over a mock CUDA runtime (streams as deferred queues run in eager, lazy
    # and random orders, kernels by their CPU twins), against the CPU engine bit for bit:
    # its stream and event ordering is tested on every machine, GPU or not. Only the CUDA
    # headers are used; nothing links cudart.
    add_executable(test_engine_cuda_mock ${CMAKE_SOURCE_DIR}/tests/cuda/test_engine_cuda_mock.c
      ${CMAKE_SOURCE_DIR}/tests/lib/blas_start.c
      ${CMAKE_SOURCE_DIR}/tests/cuda/mock_cuda.c ${CMAKE_SOURCE_DIR}/src/cuda/engine_cuda.c
      ${CMAKE_SOURCE_DIR}/src/cuda/engine_cuda_run.c ${CMAKE_SOURCE_DIR}/src/cuda/engine_cuda_optim.c
      ${CMAKE_SOURCE_DIR}/src/cuda/engine_cuda_layers.c ${CMAKE_SOURCE_DIR}/src/cuda/engine_cuda_vmm.c
      ${CMAKE_SOURCE_DIR}/src/cuda/engine_cuda_zero.c ${CMAKE_SOURCE_DIR}/src/cuda/engine_cuda_msg.c)
    target_include_directories(test_engine_cuda_mock PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
    target_link_libraries(test_engine_cuda_mock PRIVATE ptcore)
    add_test(NAME test_engine_cuda_mock COMMAND test_engine_cuda_mock)
    set_tests_properties(test_engine_cuda_mock PROPERTIES LABELS "unit;cuda;slow" TIMEOUT 300
      COST 100) # slow and quick: tests/CMakeLists.txt

    # The whole plugin over the mock runtime, for tests/cuda_mock_e2e.sh: pipetrain's real
    # --device cuda path (loading, GPU choice, executor, CUDA engine) on any machine.
    add_library(pipetrain_cuda_mock MODULE ${PT_CUDA_PLUGIN_SOURCES}
      ${CMAKE_SOURCE_DIR}/tests/cuda/mock_cuda.c ${CMAKE_SOURCE_DIR}/tests/cuda/mock_cuda_device.c)
    target_include_directories(pipetrain_cuda_mock PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
    target_link_libraries(pipetrain_cuda_mock PRIVATE ptengine)
    set_target_properties(pipetrain_cuda_mock PROPERTIES OUTPUT_NAME pipetrain-cuda-mock
      PREFIX lib LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests C_VISIBILITY_PRESET hidden)
    target_link_options(pipetrain_cuda_mock PRIVATE -Wl,--exclude-libs,ALL -Wl,--no-undefined)

    # The transformer kernels' device code (kernels/cuda/transformer_math.cuh) run on the
    # host thread by thread against the CPU twins: needs nvcc, not a GPU, so it runs here.
    add_executable(test_transformer_host ${CMAKE_SOURCE_DIR}/tests/cuda/test_transformer_host.cu)
    target_link_libraries(test_transformer_host PRIVATE ptkernels)
    target_include_directories(test_transformer_host PRIVATE ${CMAKE_SOURCE_DIR})
    # No kernel is launched, but nvcc's objects register their (empty) fat binary: the
    # static runtime, so that no CUDA library is loaded (tests/device_cli.sh checks that
    # the test binaries other than test_cuda_kernels link none).
    set_target_properties(test_transformer_host PROPERTIES CUDA_STANDARD 17
      CUDA_RUNTIME_LIBRARY Static)
    target_compile_options(test_transformer_host PRIVATE
      "$<$<COMPILE_LANGUAGE:CUDA>:${pt_cuda_flags}>")
    add_test(NAME test_transformer_host COMMAND test_transformer_host)
    set_tests_properties(test_transformer_host PROPERTIES LABELS "unit;cuda;nvcc;quick"
      TIMEOUT 120)

    # A plain program (not Criterion): exits 77, which ctest reports as skipped, when the
    # machine has no usable GPU. Its cases and their harness (kernel_check.c).
    add_executable(test_cuda_kernels ${CMAKE_SOURCE_DIR}/tests/cuda/test_cuda_kernels.c
      ${CMAKE_SOURCE_DIR}/tests/cuda/kernel_check.c)
    target_link_libraries(test_cuda_kernels PRIVATE ptcuda)
    set_target_properties(test_cuda_kernels PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
    add_test(NAME test_cuda_kernels COMMAND test_cuda_kernels)
    set_tests_properties(test_cuda_kernels PROPERTIES SKIP_RETURN_CODE 77
      LABELS "unit;cuda;nvcc;quick" TIMEOUT 300)
    if(PT_SANITIZE)
      # On a GPU machine: ASan's protected shadow gap overlaps the address range the CUDA
      # driver reserves (every cudaMalloc then fails), and the driver's and libraries'
      # never-freed allocations are reported as leaks (google/sanitizers#629). Our own
      # leaks are still reported.
      set(pt_lsan_supp ${CMAKE_BINARY_DIR}/lsan_cuda.supp)
      file(WRITE ${pt_lsan_supp}
        "leak:libcuda.so\nleak:libcudart.so\nleak:libcublas.so\nleak:libcublasLt.so\n")
      set_tests_properties(test_cuda_kernels PROPERTIES ENVIRONMENT
        "ASAN_OPTIONS=protect_shadow_gap=0;LSAN_OPTIONS=suppressions=${pt_lsan_supp}")
    endif()
  endif()
endif()

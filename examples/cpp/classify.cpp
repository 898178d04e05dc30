// classify.cpp: a C++ application that runs an aotconv-compiled network (lenet5) on its own
// OpenCL context and queue, from and into its own device buffers.
//
//   classify_cpp PARAMS.bin [INPUT.bin OUTPUT.bin]
//
// The application picks the device (the first one the library accepts), makes the context and
// an in-order queue, and hands them to create_with_queue; the handle retains them, so the
// application may release its references whenever it is done with them. The input goes into
// the application's cl_mem, run_buffers enqueues the network between the two buffers on that
// queue, and the application's own read, later on the same queue, sees the output.
//
//   c++ classify.cpp $(PKG_CONFIG_PATH=BUILD pkg-config --cflags --libs lenet5 OpenCL)
//       -Wl,-rpath,BUILD      (one command line)
// or with CMake: examples/CMakeLists.txt (find_package(lenet5)).
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

// the OpenCL version this application is written for (clCreateCommandQueue is 1.2's); the
// network's header includes <CL/cl.h> and keeps a version set before it
#define CL_TARGET_OPENCL_VERSION 120
#include "lenet5.h"

namespace {

constexpr size_t kIn = AOTCONV_LENET5_INPUT_COUNT, kOut = AOTCONV_LENET5_OUTPUT_COUNT;

// The library's errors as exceptions; last_error(nullptr) explains a failed create.
void check(int rc, const char *what, const aotconv_lenet5 *net)
{
    if (rc != AOTCONV_LENET5_OK)
        throw std::runtime_error(std::string(what) + " (" + std::to_string(rc) + "): " +
                                 aotconv_lenet5_last_error(net));
}

void check_cl(cl_int err, const char *what)
{
    if (err != CL_SUCCESS)
        throw std::runtime_error(std::string(what) + " failed: OpenCL error " +
                                 std::to_string(err));
}

struct NetDeleter {
    void operator()(aotconv_lenet5 *n) const { aotconv_lenet5_destroy(n); }
};
using Net = std::unique_ptr<aotconv_lenet5, NetDeleter>;

struct MemDeleter {
    void operator()(cl_mem m) const { clReleaseMemObject(m); }
};
using Mem = std::unique_ptr<std::remove_pointer<cl_mem>::type, MemDeleter>;

// The application's OpenCL objects on the first device the network accepts.
struct Classifier {
    cl_context context = nullptr;
    cl_command_queue queue = nullptr;
    Net net;
};

Classifier open_classifier()
{
    cl_platform_id platforms[8];
    cl_uint np = 0;
    check_cl(clGetPlatformIDs(8, platforms, &np), "clGetPlatformIDs");
    std::string tried;
    for (cl_uint p = 0; p < np && p < 8; ++p) {
        cl_device_id devices[8];
        cl_uint nd = 0;
        if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 8, devices, &nd) != CL_SUCCESS)
            continue;
        for (cl_uint d = 0; d < nd && d < 8; ++d) {
            cl_int err;
            Classifier s;
            s.context = clCreateContext(nullptr, 1, &devices[d], nullptr, nullptr, &err);
            check_cl(err, "clCreateContext");
            s.queue = clCreateCommandQueue(s.context, devices[d], 0, &err);
            check_cl(err, "clCreateCommandQueue");
            aotconv_lenet5 *raw = nullptr;
            int rc = aotconv_lenet5_create_with_queue(&raw, s.context, devices[d], s.queue,
                                                      nullptr);
            if (rc == AOTCONV_LENET5_OK) {
                s.net.reset(raw);
                return s;
            }
            tried += std::string("\n  ") + aotconv_lenet5_last_error(nullptr);
            clReleaseCommandQueue(s.queue);
            clReleaseContext(s.context);
        }
    }
    throw std::runtime_error("no OpenCL device runs lenet5:" + tried);
}

std::vector<float> read_floats(const char *path, size_t n)
{
    std::vector<float> x(n);
    std::ifstream f(path, std::ios::binary);
    if (!f.read(reinterpret_cast<char *>(x.data()), std::streamsize(n * sizeof(float))))
        throw std::runtime_error(std::string(path) + " does not hold " + std::to_string(n) +
                                 " floats");
    return x;
}

}  // namespace

int main(int argc, char **argv)
{
    if (argc != 2 && argc != 4) {
        std::fprintf(stderr, "usage: classify_cpp PARAMS.bin [INPUT.bin OUTPUT.bin]\n");
        return 2;
    }
    try {
        std::vector<float> in = argc == 4 ? read_floats(argv[2], kIn) : std::vector<float>(kIn);
        if (argc == 2)
            for (size_t i = 0; i < kIn; ++i)
                in[i] = float((i * 37) % 101) / 101.0f - 0.5f;

        Classifier s = open_classifier();
        check(aotconv_lenet5_load_params(s.net.get(), argv[1]), "load_params", s.net.get());

        cl_int err;
        Mem din(clCreateBuffer(s.context, CL_MEM_READ_ONLY, kIn * sizeof(float), nullptr, &err));
        check_cl(err, "clCreateBuffer(input)");
        Mem dout(clCreateBuffer(s.context, CL_MEM_WRITE_ONLY, kOut * sizeof(float), nullptr,
                                &err));
        check_cl(err, "clCreateBuffer(output)");
        check_cl(clEnqueueWriteBuffer(s.queue, din.get(), CL_FALSE, 0, kIn * sizeof(float),
                                      in.data(), 0, nullptr, nullptr), "clEnqueueWriteBuffer");

        // a buffer too small for the output is refused, with a message, before anything runs
        Mem tiny(clCreateBuffer(s.context, CL_MEM_READ_WRITE, 16, nullptr, &err));
        check_cl(err, "clCreateBuffer(tiny)");
        if (aotconv_lenet5_run_buffers(s.net.get(), din.get(), tiny.get()) !=
            AOTCONV_LENET5_ERR_ARGUMENT)
            throw std::runtime_error("run_buffers accepted a 16-byte output");

        check(aotconv_lenet5_run_buffers(s.net.get(), din.get(), dout.get()), "run_buffers",
              s.net.get());
        std::vector<float> out(kOut);
        // the same in-order queue: this read follows the network's last command
        check_cl(clEnqueueReadBuffer(s.queue, dout.get(), CL_TRUE, 0, kOut * sizeof(float),
                                     out.data(), 0, nullptr, nullptr), "clEnqueueReadBuffer");

        // the application may let go of its own references now: the handle holds its own
        cl_command_queue queue = s.queue;
        cl_context context = s.context;
        clReleaseCommandQueue(queue);
        clReleaseContext(context);
        std::vector<float> again(kOut);
        check(aotconv_lenet5_run(s.net.get(), in.data(), kIn, again.data(), kOut), "run",
              s.net.get());
        if (again != out)
            throw std::runtime_error("run and run_buffers disagree");

        for (size_t img = 0; img < kOut / 10 && img < 8; ++img) {
            size_t best = 0;
            for (size_t c = 1; c < 10; ++c)
                if (out[img * 10 + c] > out[img * 10 + best])
                    best = c;
            std::printf("image %zu: class %zu (%.3f)\n", img, best, out[img * 10 + best]);
        }
        if (argc == 4) {
            std::ofstream f(argv[3], std::ios::binary);
            f.write(reinterpret_cast<const char *>(out.data()),
                    std::streamsize(kOut * sizeof(float)));
            if (!f)
                throw std::runtime_error(std::string("cannot write ") + argv[3]);
        }
    } catch (const std::exception &e) {
        std::fprintf(stderr, "classify_cpp: %s\n", e.what());
        return 1;
    }
    return 0;
}

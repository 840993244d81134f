// The C interface of the libasynctp_c.so the Python package loaded, and the communicator of each
// process group. This library does not link libasynctp_c.so: the package hands over the functions of
// its own copy (asynctp_torch_init), so that a handle made through ctypes is one they know, and a
// function that makes a group's communicator (asynctp_torch_set_factory), which the ops call on a
// group's first use.
#pragma once

#include <string>

#include "asynctp/c_api.h"

extern "C" {
// What asynctp_torch_init takes: the C functions the ops call, from libasynctp_c.so.
typedef struct {
  int32_t c_api_version;  // ASYNCTP_C_API_VERSION of the library the functions come from
  int (*all_gather_matmul)(asynctp_comm*, const asynctp_tensor*, const asynctp_tensor*, int, int,
                           const asynctp_tensor*, const asynctp_tensor*, void*, const asynctp_op_options*);
  int (*matmul_reduce_scatter)(asynctp_comm*, const asynctp_tensor*, const asynctp_tensor*, int, int,
                               const asynctp_tensor*, void*, const asynctp_op_options*);
  int (*refuse_call)(asynctp_comm*, const char*, const char*, void*, int);
  const char* (*last_error)(void);
  int (*comm_world_size)(const asynctp_comm*, int*);
  int (*comm_device)(const asynctp_comm*, int*);
} asynctp_torch_c_functions;

// Makes (collectively, on a group's first use) or finds the communicator of process group `group`:
// 0 and *comm set, or non-zero with a message of at most why_bytes - 1 bytes in `why`.
typedef int (*asynctp_torch_factory)(const char* group, asynctp_comm** comm, char* why, size_t why_bytes);

// 0, or -1 where the C API's version is not the one this library was built for.
__attribute__((visibility("default"))) int asynctp_torch_init(const asynctp_torch_c_functions* functions);
__attribute__((visibility("default"))) void asynctp_torch_set_factory(asynctp_torch_factory factory);
// Before a group's communicator is destroyed: the ops ask the factory again on the group's next use
// (every group's, on every thread).
__attribute__((visibility("default"))) void asynctp_torch_forget_group(const char* group);
}

namespace asynctp::torch_ext {

// The C functions; throws where asynctp_torch_init has not run.
const asynctp_torch_c_functions& c_functions();

// A group's communicator, with what the ops need of it.
struct Group {
  asynctp_comm* comm = nullptr;
  int world_size = 0;
  int device = -1;
};
// The communicator of the process group named `name`, made through the factory on first use.
Group group(const std::string& name);

// Throws the C interface's last error where rc is not 0.
void check(int rc);

}  // namespace asynctp::torch_ext

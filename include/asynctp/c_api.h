/* asynctp's C interface: the host API behind a stable C ABI, for bindings (the Python package loads
 * it with ctypes) and for callers built with another C++ standard library.
 *
 * Every function returns 0 on success. On failure it returns -1 and leaves the message of the
 * asynctp::Error (or other exception) it caught in asynctp_last_error(), which is per thread and
 * stays valid until this thread's next failing call. Nothing throws across this boundary.
 *
 * Tensors are DLPack-like views: data pointer, dtype, shape and strides in elements. The meaning of
 * each argument is that of the C++ function of the same name in asynctp/ops.h. */
#ifndef ASYNCTP_C_API_H_
#define ASYNCTP_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ASYNCTP_C_API_VERSION 8
#define ASYNCTP_C_MAX_DIMS 6
#define ASYNCTP_C_UNIQUE_ID_BYTES 128

typedef struct asynctp_comm asynctp_comm;   /* an asynctp::Communicator, opaque */
typedef struct asynctp_group asynctp_group; /* an asynctp::InProcessGroup, opaque */
typedef struct asynctp_symmetric asynctp_symmetric; /* symmetric memory and its signal pad, opaque */

enum asynctp_dtype { ASYNCTP_BF16 = 0, ASYNCTP_FP16 = 1, ASYNCTP_FP32 = 2, ASYNCTP_FP8E4M3 = 3, ASYNCTP_FP8E5M2 = 4 };
enum asynctp_algorithm { ASYNCTP_SEQUENTIAL = 0, ASYNCTP_PIPELINED = 1, ASYNCTP_FUSED = 2, ASYNCTP_AUTO = 3 };
enum asynctp_b_layout { ASYNCTP_ROW_MAJOR = 0, ASYNCTP_COL_MAJOR = 1 };
enum asynctp_reduce_op { ASYNCTP_SUM = 0, ASYNCTP_AVG = 1 };

typedef struct {
  void* data;
  int32_t dtype; /* enum asynctp_dtype */
  int32_t ndim;
  int64_t shape[ASYNCTP_C_MAX_DIMS];
  int64_t strides[ASYNCTP_C_MAX_DIMS];
} asynctp_tensor;

/* asynctp::OpOptions; asynctp_op_options_default() fills in the C++ defaults. */
typedef struct {
  int32_t algorithm;          /* enum asynctp_algorithm */
  int32_t b_layout;           /* enum asynctp_b_layout */
  int32_t check_across_ranks; /* 0 or 1 */
  int32_t chunks_per_rank;    /* 0: the algorithm's default */
  int32_t check_pointers;     /* 0 or 1 */
} asynctp_op_options;

/* ASYNCTP_C_API_VERSION of the library loaded; a binding compares it with the one it was written for. */
int asynctp_c_api_version(void);
/* "0.1.0" */
const char* asynctp_version_string(void);
const char* asynctp_last_error(void);
void asynctp_op_options_default(asynctp_op_options* options);

/* ncclGetUniqueId into `id` (ASYNCTP_C_UNIQUE_ID_BYTES bytes); one rank makes it, all pass it on. */
int asynctp_get_unique_id(unsigned char* id);

/* asynctp::Communicator::create. device < 0: the thread's current device; timeout_ms <= 0 and
 * tuning_cache NULL or "": the defaults of CommunicatorOptions. Collective. */
int asynctp_comm_create(int rank, int world_size, const unsigned char* id, int device, int timeout_ms,
                        const char* tuning_cache, asynctp_comm** comm);
/* asynctp::Communicator::wrap: a communicator on `nccl_comm`, an ncclComm_t the caller made (a
 * framework's own, for instance) and keeps alive until this handle is destroyed; asynctp neither
 * destroys nor aborts it. Runs on the GPU nccl_comm was made for. timeout_ms <= 0 and tuning_cache
 * NULL or "": the defaults of CommunicatorOptions. on_overdue (may be NULL): called as
 * on_overdue(on_overdue_arg), once and on a thread of its own, when a call is overdue on the GPU
 * (CommunicatorOptions::on_overdue): where the caller aborts nccl_comm. Collective over nccl_comm's
 * ranks. */
int asynctp_comm_wrap(void* nccl_comm, int timeout_ms, const char* tuning_cache, void (*on_overdue)(void*),
                      void* on_overdue_arg, asynctp_comm** comm);
/* The NCCL versions, as NCCL_VERSION_CODE (22809 for 2.28.9): the one loaded in this process, and the
 * one this library was built with. A communicator needs the two to be the same. */
int asynctp_nccl_versions(int* runtime, int* build);
/* Collective. Accepts NULL. A handle destroyed already (or not made here), or one another thread's
 * call is still using, is refused with an error and not touched. */
int asynctp_comm_destroy(asynctp_comm* comm);

/* asynctp::InProcessGroup::create: world_size ranks as threads of this process, for running
 * multi-rank code on fewer GPUs than ranks (tests, development). Rank r runs on
 * devices[r % num_devices]; num_devices 0 (devices may be NULL): every visible GPU. Set
 * CUDA_MODULE_LOADING=EAGER before the process's first CUDA call (asynctp/in_process.h says why). */
int asynctp_in_process_group_create(int world_size, const int* devices, int num_devices, asynctp_group** group);
/* Once every rank's communicator is destroyed. Accepts NULL. */
int asynctp_in_process_group_destroy(asynctp_group* group);
/* asynctp::Communicator::create_in_process: each rank's thread calls it, all at once (collective).
 * timeout_ms <= 0, tuning_cache NULL or "" and sm_budget 0: the defaults of CommunicatorOptions. */
int asynctp_comm_create_in_process(asynctp_group* group, int rank, int timeout_ms, const char* tuning_cache,
                                   int sm_budget, asynctp_comm** comm);
int asynctp_comm_rank(const asynctp_comm* comm, int* rank);
int asynctp_comm_world_size(const asynctp_comm* comm, int* world_size);
int asynctp_comm_device(const asynctp_comm* comm, int* device);

/* gathered_a may be NULL. stream is a cudaStream_t (NULL: the legacy default stream). */
int asynctp_all_gather_matmul(asynctp_comm* comm, const asynctp_tensor* a_shard, const asynctp_tensor* bs,
                              int num_bs, int gather_dim, const asynctp_tensor* outputs,
                              const asynctp_tensor* gathered_a, void* stream, const asynctp_op_options* options);
int asynctp_matmul_reduce_scatter(asynctp_comm* comm, const asynctp_tensor* a, const asynctp_tensor* b,
                                  int scatter_dim, int reduce_op, const asynctp_tensor* output, void* stream,
                                  const asynctp_op_options* options);

/* The scaled ops (asynctp/scaled_ops.h): fp8 A and B, fp32 scales (b_scales one per B). options NULL:
 * the defaults of ScaledOpOptions (B column-major); use_fast_accum 0 or 1. biases and result_scales:
 * NULL for none, else num_bs of each (bias and result_scale: NULL or one), an element whose data is
 * NULL standing for none. */
int asynctp_all_gather_scaled_matmul(asynctp_comm* comm, const asynctp_tensor* a_shard, const asynctp_tensor* bs,
                                     int num_bs, const asynctp_tensor* a_scale, const asynctp_tensor* b_scales,
                                     int gather_dim, const asynctp_tensor* outputs, const asynctp_tensor* gathered_a,
                                     void* stream, const asynctp_op_options* options, int use_fast_accum,
                                     const asynctp_tensor* biases, const asynctp_tensor* result_scales);
int asynctp_scaled_matmul_reduce_scatter(asynctp_comm* comm, const asynctp_tensor* a, const asynctp_tensor* b,
                                         const asynctp_tensor* a_scale, const asynctp_tensor* b_scale, int scatter_dim,
                                         int reduce_op, const asynctp_tensor* output, void* stream,
                                         const asynctp_op_options* options, int use_fast_accum,
                                         const asynctp_tensor* bias, const asynctp_tensor* result_scale);

/* For a binding that refuses a call of `op` (the name of one of the four ops above) with its
 * own checks before it reaches the op: shares the refusal with the other ranks through the op's
 * agreement across ranks, so that their calls fail at once ("rank R refused its arguments") instead of
 * waiting out the timeout. Always returns -1, with `why` as the message. check_across_ranks 0 (the
 * op's option), or a stream being captured: nothing is shared, as the op would not compare either.
 * The C API's own argument checks of the two ops above do this already. */
int asynctp_refuse_call(asynctp_comm* comm, const char* op, const char* why, void* stream, int check_across_ranks);

/* asynctp::Communicator::synchronize: waits for `stream`, turning a timed-out wait into an error. */
int asynctp_comm_synchronize(const asynctp_comm* comm, void* stream);

/* Symmetric memory for kernels of one's own (docs/reference/symmetric_memory.md): a buffer that every
 * rank allocates at once and every rank can address, and a pad of uint32 signal flags beside it, on
 * a communicator whose ranks share one node. */

/* asynctp::device::WaitContext (asynctp/device/wait_context.h): what a kernel's bounded wait needs. */
typedef struct {
  void* fault;         /* the process's fault record, where a wait that gives up reports */
  uint64_t timeout_ns; /* the communicator's timeout */
  int32_t rank;
  int32_t unused;
} asynctp_wait_context;

typedef struct {
  void* buffer;              /* this rank's buffer: `bytes` bytes, zero at creation */
  uint64_t bytes;            /* the size asked for, rounded up to NCCL's window alignment */
  void* buffer_ptrs_dev;     /* device array of world_size pointers: rank r's buffer, for kernels */
  uint32_t* signal_pad;      /* this rank's signal pad: signal_count flags, zero at creation */
  void* signal_pad_ptrs_dev; /* device array of world_size pointers: rank r's signal pad */
  int32_t signal_count;
  int32_t rank;
  int32_t world_size;
  int32_t unused;
  asynctp_wait_context wait; /* for asynctp/device/signals.cuh's waits */
} asynctp_symmetric_info;

/* Collective: every rank calls it with the same bytes (> 0) and signal_count (> 0). The memory stays
 * until asynctp_symmetric_destroy; the communicator cannot be destroyed before it. A tensor in the
 * buffer passed to asynctp_all_gather_matmul as a_shard is read in place by `pipelined`. */
int asynctp_symmetric_create(asynctp_comm* comm, uint64_t bytes, int signal_count, asynctp_symmetric** sym);
/* Collective. Accepts NULL. Once no kernel or copy on any rank uses the memory any more. */
int asynctp_symmetric_destroy(asynctp_symmetric* sym);
int asynctp_symmetric_get_info(const asynctp_symmetric* sym, asynctp_symmetric_info* info);
/* Rank `rank`'s buffer and signal pad, as pointers valid in this process: cudaMemcpyAsync reads and
 * writes them with the copy engine, kernels load and store through them. For this rank they are
 * info.buffer and info.signal_pad (the device arrays may hold a second mapping of the same memory).
 * Either output may be NULL. */
int asynctp_symmetric_peer(const asynctp_symmetric* sym, int rank, void** buffer, uint32_t** signal_pad);
/* Stream-ordered: once earlier work on `stream` is done and visible, flag `index` of rank `owner`'s
 * pad := value. */
int asynctp_symmetric_put_signal(asynctp_symmetric* sym, int owner, int index, uint32_t value, void* stream);
/* Stream-ordered: later work on `stream` waits until flag `index` of rank `owner`'s pad is at least
 * `value` (modulo 2^32). Bounded by the communicator's timeout: past it, the next call that waits for
 * `stream` (asynctp_comm_synchronize) fails with a report naming the rank, the flag and its value. */
int asynctp_symmetric_wait_signal(asynctp_symmetric* sym, int owner, int index, uint32_t value, void* stream);
/* asynctp::Communicator::barrier on the buffer's communicator: stream-ordered, bounded. */
int asynctp_symmetric_barrier(asynctp_symmetric* sym, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* ASYNCTP_C_API_H_ */

// A kernel timeline without Nsight Systems (the device machines lack it): a CUDA injection
// library that records every kernel's start and end through CUPTI's activity API, kernels inside
// replayed graphs included, and writes them as CSV (start_ns,end_ns,graph_node,name) to
// $KERNEL_TRACE_OUT at exit. kernel_timeline.py reads it.
//   cc -O2 -shared -fPIC kernel_trace.c -o libkernel_trace.so -I$CUDA/include -L$CUDA/lib64 -lcupti
//   CUDA_INJECTION64_PATH=$PWD/libkernel_trace.so KERNEL_TRACE_OUT=trace.csv python3 ...
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

static FILE* out;

static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *size = 8 << 20;
    *buffer = (uint8_t*)aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size, size_t valid) {
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity* record = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
        const CUpti_ActivityKernel10* k = (const CUpti_ActivityKernel10*)record;
        fprintf(out, "%llu,%llu,%llu,%s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                (unsigned long long)k->graphNodeId, k->name);
    }
    free(buffer);
}

static void flush_at_exit(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    fclose(out);
}

int InitializeInjection(void) {
    const char* path = getenv("KERNEL_TRACE_OUT");
    out = fopen(path ? path : "kernel_trace.csv", "w");
    if (!out) return 0;
    fprintf(out, "start_ns,end_ns,graph_node,name\n");
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI activity tracing could not start\n");
        return 0;
    }
    atexit(flush_at_exit);
    return 1;
}

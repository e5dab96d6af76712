// A chain of 100 small kernels in one CUDA graph, launched plainly and with programmatic dependent
// launch (griddepcontrol.wait at entry): GPU time per kernel. Build and run on a GPU machine:
//   nvcc -arch=sm_90 -O2 bench/gpu/pdl_chain.cu -o pdl_chain && ./pdl_chain
#include <cstdio>
#include <cuda_runtime.h>
#include <vector>
#include <algorithm>
__global__ void k(float* p, int n, int pdl, int work) {
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = p[i % n];
  for (int j = 0; j < work; ++j) v = v * 1.0000001f + 1e-7f;
  if (pdl) asm volatile("griddepcontrol.launch_dependents;");
  p[i % n] = v;
}
__global__ void kw(float* p, const float* w, int n, int wn, int pdl) {  // prefetch w before wait
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float s = 0;
  for (int j = i; j < wn; j += gridDim.x * blockDim.x) s += w[j];
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (pdl) asm volatile("griddepcontrol.launch_dependents;");
  p[i % n] += s * 1e-30f;
}
int main() {
  float *p, *w; cudaMalloc(&p, 1 << 24); cudaMalloc(&w, 64 << 20); cudaMemset(p, 0, 1 << 24); cudaMemset(w, 0, 64 << 20);
  cudaStream_t s; cudaStreamCreate(&s);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  const int N = 100;
  for (int variant = 0; variant < 3; ++variant)
  for (int blocks : {1, 32, 132, 264})
  for (int pdl = 0; pdl < 2; ++pdl) {
    cudaGraph_t g; cudaGraphExec_t ge;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    for (int i = 0; i < N; ++i) {
      cudaLaunchConfig_t c = {}; c.gridDim = blocks; c.blockDim = 128; c.stream = s;
      cudaLaunchAttribute a[1]; a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; a[0].val.programmaticStreamSerializationAllowed = 1;
      c.attrs = a; c.numAttrs = pdl ? 1 : 0;
      cudaError_t err;
      if (variant == 2) err = cudaLaunchKernelEx(&c, kw, p, (const float*)w + (i % 8) * (1 << 20), 1 << 20, 1 << 20, pdl);  // 4 MB of weights each
      else err = cudaLaunchKernelEx(&c, k, p, blocks * 128, pdl, variant == 0 ? 0 : 2000);
      if (err) { printf("launch err %s\n", cudaGetErrorString(err)); return 1; }
    }
    cudaStreamEndCapture(s, &g);
    if (cudaGraphInstantiate(&ge, g, 0)) { printf("inst err\n"); return 1; }
    std::vector<float> ms;
    for (int r = 0; r < 30; ++r) {
      cudaEventRecord(e0, s); cudaGraphLaunch(ge, s); cudaEventRecord(e1, s); cudaEventSynchronize(e1);
      float t; cudaEventElapsedTime(&t, e0, e1); ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    printf("{\"variant\": \"%s\", \"blocks\": %d, \"pdl\": %d, \"us_per_kernel_median\": %.3f, \"min\": %.3f}\n",
           variant == 0 ? "empty" : variant == 1 ? "work2000" : "read4MB", blocks, pdl, ms[15] * 1000 / N, ms[0] * 1000 / N);
    cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
  }
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}

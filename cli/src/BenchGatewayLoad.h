// The load generator of `dsec bench gateway`: C threads, each on its own keep-alive connection, creating
// sandboxes through the gateway as fast as it answers.
#pragma once

#include <string>
#include <vector>

namespace dsec::cli {

class Progress;

struct CreateLoad {
  int port = 0;         // the gateway's, on 127.0.0.1
  std::string request;  // the whole POST /v1/sandboxes request, sent as is for every create
  int warmup = 0;       // creates before the measurement (their latencies are not kept)
  int count = 0;        // creates measured
  int concurrency = 1;
  Progress* progress = nullptr;  // counts every create, warm-up included
};

struct CreateLoadResult {
  std::vector<double> latencies_ms;  // of the measured creates that succeeded
  std::vector<std::string> ids;      // every sandbox created, warm-up included
  int failures = 0;                  // measured creates that did not answer 201 with an id
  std::string first_error;
  double wall_start = 0;     // monotonic, when the threads started
  double measure_start = 0;  // monotonic, when the measurement started (after the warm-up)
  double end = 0;            // monotonic, when the last thread finished
  double cpu_seconds = 0;    // this process's CPU time from wall_start to end
};

CreateLoadResult runCreateLoad(const CreateLoad& load);

}  // namespace dsec::cli

// Exec and call results as HTTP answers, within the node's output budget (OutputBudget.h). A buffered exec
// collects its command's output in blocks drawn from the budget (BufferedExecOutput, the exec's sink); the
// answer is the exec result object of docs/api.md with a Content-Length, escaped piece by piece as it is
// written, each block freed once sent. No second copy of the output exists, escaped or not.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "dsec/backends/Sandbox.h"
#include "dsec/launcher/api/HttpServer.h"
#include "dsec/launcher/api/OutputBudget.h"

namespace dsec::launcher {

// Output bytes in blocks that grow from 16 KiB to 1 MiB; blocks of 256 KiB and more are mapped directly, so
// freeing them gives the memory back to the system at once.
class OutputBlocks {
 public:
  OutputBlocks() = default;
  ~OutputBlocks() { clear(); }
  OutputBlocks(const OutputBlocks&) = delete;
  OutputBlocks& operator=(const OutputBlocks&) = delete;

  // Copies as much of data as fits in the last block; returns the bytes taken.
  size_t appendSome(const char* data, size_t size);
  // The capacity the next block will have.
  size_t nextCapacity() const;
  // Adds an empty block of nextCapacity(); false if the memory cannot be had.
  bool addBlock();
  void clear();
  size_t blockCount() const { return blocks_.size(); }
  std::string_view block(size_t i) const { return {blocks_[i].data, blocks_[i].size}; }
  size_t blockCapacity(size_t i) const { return blocks_[i].capacity; }
  // Frees block i (already written); its view becomes empty.
  void freeBlock(size_t i);

 private:
  struct Block {
    char* data = nullptr;
    size_t size = 0;
    size_t capacity = 0;
    bool mapped = false;
  };
  static void release(Block& b);
  std::vector<Block> blocks_;
};

// The sink of a buffered exec: keeps stdout and stderr within the output budget. When the budget refuses (or
// evicts this output for a larger one elsewhere), the output is dropped and the sink returns false, which
// stops the command; the request is then answered 429 (or 413 when the output alone is over the budget).
class BufferedExecOutput : public backends::ExecSink, public OutputBudget::Evictable {
 public:
  explicit BufferedExecOutput(OutputBudget* budget);
  ~BufferedExecOutput() override;

  bool onStdout(const char* data, size_t size) override { return append(0, data, size); }
  bool onStderr(const char* data, size_t size) override { return append(1, data, size); }
  void evict() override;

  // After the exec: answers 200 with the result, or the budget's refusal.
  void respond(HttpExchange& ex, const backends::ExecResult& result);

 private:
  bool append(int stream, const char* data, size_t size);
  void dropLocked();

  OutputBudget* budget_;
  std::unique_ptr<OutputBudget::Share> share_;
  std::mutex mu_;
  OutputBlocks streams_[2];  // stdout, stderr
  OutputBudget::Take failure_ = OutputBudget::Take::kOk;
  bool dropped_ = false;
  uint64_t offered_ = 0;  // output bytes the command produced (within its output_cap)
};

// A call's result (already whole in memory) as the answer, if the budget has room for it.
void respondWithinBudget(HttpExchange& ex, OutputBudget* budget, const backends::ExecResult& result);

// Writes the exec result object of docs/api.md: stdout and stderr come as pieces (escaped as they are
// written); after each piece is on the wire, written(stream, index) is called (0 stdout, 1 stderr).
void sendExecResultPieces(HttpExchange& ex, const backends::ExecResult& result,
                          const std::vector<std::string_view> (&pieces)[2],
                          const std::function<void(int stream, size_t index)>& written);

// The budget's refusal as an HTTP answer: 429 capacity with retry_after, or 413 too_large. `consequence`
// says what happened to the work ("the output was dropped and the command stopped").
void sendBudgetRefusal(HttpExchange& ex, OutputBudget::Take why, uint64_t bytes, uint64_t capacity,
                       const std::string& consequence);

}  // namespace dsec::launcher

// Exec and call results as HTTP answers within the output budget (ExecResponse.h).
#include "dsec/launcher/api/ExecResponse.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "dsec/launcher/api/JsonEscape.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;
constexpr size_t kFirstBlock = size_t{16} * 1024;
constexpr size_t kLargestBlock = size_t{1} << 20;
constexpr size_t kMappedFrom = size_t{256} * 1024;
constexpr size_t kEscapeSlice = size_t{16} * 1024;  // raw bytes escaped at a time (at most 96 KiB out)

std::string scalar(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

// ---- OutputBlocks ---------------------------------------------------------------------------------------

size_t OutputBlocks::appendSome(const char* data, size_t size) {
  if (blocks_.empty()) return 0;
  Block& b = blocks_.back();
  size_t n = std::min(size, b.capacity - b.size);
  if (n > 0) std::memcpy(b.data + b.size, data, n);
  b.size += n;
  return n;
}

size_t OutputBlocks::nextCapacity() const {
  if (blocks_.empty()) return kFirstBlock;
  return std::min(blocks_.back().capacity * 2, kLargestBlock);
}

bool OutputBlocks::addBlock() {
  Block b;
  b.capacity = nextCapacity();
  b.mapped = b.capacity >= kMappedFrom;
  if (b.mapped) {
    void* p = ::mmap(nullptr, b.capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    b.data = static_cast<char*>(p);
  } else {
    b.data = static_cast<char*>(std::malloc(b.capacity));
    if (b.data == nullptr) return false;
  }
  try {
    blocks_.push_back(b);
  } catch (const std::bad_alloc&) {
    release(b);
    return false;
  }
  return true;
}

void OutputBlocks::release(Block& b) {
  if (b.data == nullptr) return;
  if (b.mapped) {
    ::munmap(b.data, b.capacity);
  } else {
    std::free(b.data);
  }
  b.data = nullptr;
  b.size = 0;
}

void OutputBlocks::freeBlock(size_t i) { release(blocks_[i]); }

void OutputBlocks::clear() {
  for (auto& b : blocks_) release(b);
  blocks_.clear();
}

// ---- BufferedExecOutput ---------------------------------------------------------------------------------

BufferedExecOutput::BufferedExecOutput(OutputBudget* budget) : budget_(budget), share_(budget->open(this)) {}

BufferedExecOutput::~BufferedExecOutput() {
  share_.reset();  // first: waits for an eviction of this output under way (which needs mu_ and the blocks)
}

void BufferedExecOutput::dropLocked() {
  dropped_ = true;
  streams_[0].clear();
  streams_[1].clear();
}

void BufferedExecOutput::evict() {
  std::lock_guard lock(mu_);
  if (failure_ == OutputBudget::Take::kOk) failure_ = OutputBudget::Take::kBusy;
  dropLocked();
}

bool BufferedExecOutput::append(int stream, const char* data, size_t size) {
  OutputBlocks& blocks = streams_[stream];
  {
    std::lock_guard lock(mu_);
    if (dropped_) return false;
    offered_ += size;
  }
  while (size > 0) {
    size_t capacity = 0;
    {
      std::lock_guard lock(mu_);
      if (dropped_) return false;
      size_t n = blocks.appendSome(data, size);
      data += n;
      size -= n;
      if (size == 0) return true;
      capacity = blocks.nextCapacity();
    }
    // The budget is asked without our lock: an eviction of this output (from another share's ask) takes it.
    OutputBudget::Take taken = share_->take(capacity);
    bool added = false;
    {
      std::lock_guard lock(mu_);
      if (taken == OutputBudget::Take::kOk && !dropped_) added = blocks.addBlock();
      if (!added && !dropped_) {
        failure_ = taken == OutputBudget::Take::kOk ? OutputBudget::Take::kBusy : taken;
        dropLocked();
      }
    }
    if (!added) {
      share_->releaseAll();
      return false;
    }
  }
  return true;
}

void BufferedExecOutput::respond(HttpExchange& ex, const backends::ExecResult& result) {
  OutputBudget::Take failure;
  uint64_t offered;
  {
    std::lock_guard lock(mu_);
    failure = failure_;
    offered = offered_;
  }
  if (failure == OutputBudget::Take::kOk && !share_->seal()) failure = OutputBudget::Take::kBusy;
  if (failure != OutputBudget::Take::kOk) {
    {
      std::lock_guard lock(mu_);
      dropLocked();
    }
    share_->releaseAll();
    return sendBudgetRefusal(ex, failure, offered, budget_->capacity(),
                             "the output was dropped and the command stopped");
  }
  // Sealed: nothing evicts this output any more and the command is over, so the blocks are read unlocked.
  std::vector<std::string_view> pieces[2];
  for (int s = 0; s < 2; ++s) {
    for (size_t i = 0; i < streams_[s].blockCount(); ++i) pieces[s].push_back(streams_[s].block(i));
  }
  sendExecResultPieces(ex, result, pieces, [this](int stream, size_t index) {
    size_t capacity = streams_[stream].blockCapacity(index);
    streams_[stream].freeBlock(index);
    share_->give(capacity);
  });
  {
    std::lock_guard lock(mu_);
    dropLocked();  // what a failed write left
  }
  share_->releaseAll();
}

// ---- writing results ------------------------------------------------------------------------------------

void sendExecResultPieces(HttpExchange& ex, const backends::ExecResult& r,
                          const std::vector<std::string_view> (&pieces)[2],
                          const std::function<void(int stream, size_t index)>& written) {
  // The keys in nlohmann's (sorted) order, as execResultToJson + dump would write them.
  const std::string head = "{\"duration\":" + scalar(r.duration_seconds) + ",\"exit_code\":" + scalar(r.exit_code) +
                           ",\"oom_killed\":" + scalar(r.oom_killed) + ",\"signal\":" + scalar(r.signal) +
                           ",\"stderr\":\"";
  const std::string middle = "\",\"stdout\":\"";
  const std::string tail = "\",\"timed_out\":" + scalar(r.timed_out) + ",\"truncated\":" + scalar(r.truncated) + "}\n";
  uint64_t length = head.size() + middle.size() + tail.size();
  for (int s = 0; s < 2; ++s) {
    JsonStringEscaper counter;
    for (auto piece : pieces[s]) counter.count(piece, &length);
    counter.finishCount(&length);
  }
  if (!ex.beginStream(200, "application/json", length)) return;
  std::string out;
  out.reserve(kEscapeSlice * 6 + 16);
  auto flush = [&] {
    bool ok = ex.writeStream(out.data(), out.size());
    out.clear();
    return ok;
  };
  // stderr comes first in the sorted keys.
  const int order[2] = {1, 0};
  out = head;
  for (int k = 0; k < 2; ++k) {
    const int s = order[k];
    if (k == 1) out += middle;
    JsonStringEscaper escaper;
    for (size_t i = 0; i < pieces[s].size(); ++i) {
      std::string_view piece = pieces[s][i];
      for (size_t off = 0; off < piece.size(); off += kEscapeSlice) {
        escaper.append(piece.substr(off, kEscapeSlice), &out);
        if (out.size() >= kEscapeSlice && !flush()) return;
      }
      written(s, i);
    }
    escaper.finish(&out);
  }
  out += tail;
  if (!flush()) return;
  ex.endStream();
}

void sendBudgetRefusal(HttpExchange& ex, OutputBudget::Take why, uint64_t bytes, uint64_t capacity,
                       const std::string& consequence) {
  if (why == OutputBudget::Take::kTooLarge) {
    ex.sendError(413, "too_large",
                 "the output (" + std::to_string(bytes) + " bytes and more) does not fit the node's output budget of " +
                     std::to_string(capacity) + " bytes; " + consequence +
                     ": use /exec/stream for large output, or a smaller output_cap to truncate it");
    return;
  }
  ex.sendError(429, "capacity",
               "the node's output budget (" + std::to_string(capacity) +
                   " bytes for buffered exec and call output) is in use; " + consequence + ": retry later",
               {{"Retry-After", "1"}}, json{{"retry_after", 1}, {"resource", "output_budget"}});
}

void respondWithinBudget(HttpExchange& ex, OutputBudget* budget, const backends::ExecResult& result) {
  auto share = budget->open(nullptr);
  uint64_t bytes = result.stdout_data.capacity() + result.stderr_data.capacity();
  OutputBudget::Take taken = share->take(bytes);
  if (taken != OutputBudget::Take::kOk) {
    return sendBudgetRefusal(ex, taken, bytes, budget->capacity(), "the call's result was dropped");
  }
  share->seal();
  std::vector<std::string_view> pieces[2] = {{result.stdout_data}, {result.stderr_data}};
  sendExecResultPieces(ex, result, pieces, [](int, size_t) {});
}

}  // namespace dsec::launcher

// The node-wide budget for response output held in memory (docs/node-agent.md, "Output budget"). A buffered
// exec keeps its command's output until the command ends and the answer is written; a call's result is whole
// when the backend hands it over. Every such byte is drawn from one budget, so many sandboxes printing at
// once cannot grow the node without bound.
//
// A share is evictable while its exec still collects output. When a share needs more and the budget is
// full, the largest evictable share gives way: if that is another one, its memory is freed at once and its
// request fails with 429 when its command ends (a command that prints and then sleeps holds nothing); if it is
// the asking share, the ask fails. A share waits (up to wait_seconds) only for bytes held by responses being
// written, which they give back as the client reads, so nothing ever waits on another waiter.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace dsec::launcher {

class OutputBudget {
 public:
  enum class Take {
    kOk,
    kBusy,      // the budget is held by others: 429 with retry_after
    kTooLarge,  // more than the whole budget for this one response
  };

  struct Stats {
    uint64_t capacity = 0;
    uint64_t used = 0;
    uint64_t peak = 0;
    uint64_t shares = 0;     // responses holding or waiting for output now
    uint64_t refusals = 0;   // asks that failed (busy)
    uint64_t too_large = 0;  // asks for more than the whole budget
    uint64_t evictions = 0;  // shares whose output was freed to make room for another
  };

  // What holds the bytes of an evictable share; evict() frees them (called on another thread, without the
  // budget's lock, at most once).
  class Evictable {
   public:
    virtual ~Evictable() = default;
    virtual void evict() = 0;
  };

  class Share {
   public:
    ~Share();  // gives back what it holds; waits for an eviction of it under way to finish
    Share(const Share&) = delete;
    Share& operator=(const Share&) = delete;

    // Asks for `bytes` more. On kBusy/kTooLarge an evictable share is finished: its owner frees its memory
    // and calls releaseAll().
    Take take(uint64_t bytes);
    void give(uint64_t bytes);
    void releaseAll();
    // Ends the evictable phase (the response is about to be written); false if the share was evicted.
    bool seal();
    uint64_t held() const;

   private:
    friend class OutputBudget;
    Share(OutputBudget* budget, Evictable* owner) : budget_(budget), owner_(owner) {}
    bool evictable() const { return owner_ != nullptr && !sealed_ && !evicting_ && !evicted_; }

    OutputBudget* budget_;
    Evictable* owner_;
    // Under budget_->mu_:
    uint64_t held_ = 0;
    bool sealed_ = false;
    bool evicting_ = false;  // another share is freeing this one's memory
    bool evicted_ = false;
  };

  // capacity in bytes (> 0); wait_seconds: how long an ask waits for responses being written to give back.
  OutputBudget(uint64_t capacity, double wait_seconds);
  ~OutputBudget();
  OutputBudget(const OutputBudget&) = delete;
  OutputBudget& operator=(const OutputBudget&) = delete;

  // A share for one response. owner null: a share that is never evicted (a call's result, already whole).
  std::unique_ptr<Share> open(Evictable* owner);
  Stats stats() const;
  uint64_t capacity() const { return capacity_; }

 private:
  const uint64_t capacity_;
  const double wait_seconds_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Share*> shares_;
  uint64_t used_ = 0;
  uint64_t peak_ = 0;
  uint64_t refusals_ = 0;
  uint64_t too_large_ = 0;
  uint64_t evictions_ = 0;
};

// The default budget: a sixteenth of the node's memory, between 64 MiB and 1 GiB.
uint64_t defaultOutputBudget(uint64_t node_memory_bytes);

}  // namespace dsec::launcher

// The node-wide output budget (OutputBudget.h): one mutex, a list of shares, and the rule that the largest
// evictable share gives way when the budget is full.
#include "dsec/launcher/api/OutputBudget.h"

#include <algorithm>
#include <chrono>

namespace dsec::launcher {

OutputBudget::OutputBudget(uint64_t capacity, double wait_seconds)
    : capacity_(capacity), wait_seconds_(wait_seconds < 0 ? 0 : wait_seconds) {}

OutputBudget::~OutputBudget() = default;

std::unique_ptr<OutputBudget::Share> OutputBudget::open(Evictable* owner) {
  std::unique_ptr<Share> share(new Share(this, owner));
  std::lock_guard lock(mu_);
  shares_.push_back(share.get());
  return share;
}

OutputBudget::Stats OutputBudget::stats() const {
  std::lock_guard lock(mu_);
  Stats s;
  s.capacity = capacity_;
  s.used = used_;
  s.peak = peak_;
  s.shares = shares_.size();
  s.refusals = refusals_;
  s.too_large = too_large_;
  s.evictions = evictions_;
  return s;
}

OutputBudget::Share::~Share() {
  std::unique_lock lock(budget_->mu_);
  budget_->cv_.wait(lock, [this] { return !evicting_; });
  budget_->used_ -= held_;
  held_ = 0;
  auto& v = budget_->shares_;
  v.erase(std::remove(v.begin(), v.end(), this), v.end());
  budget_->cv_.notify_all();
}

uint64_t OutputBudget::Share::held() const {
  std::lock_guard lock(budget_->mu_);
  return held_;
}

void OutputBudget::Share::give(uint64_t bytes) {
  std::lock_guard lock(budget_->mu_);
  uint64_t n = std::min(bytes, held_);
  held_ -= n;
  budget_->used_ -= n;
  if (n > 0) budget_->cv_.notify_all();
}

void OutputBudget::Share::releaseAll() {
  std::lock_guard lock(budget_->mu_);
  if (evicting_) return;  // the evicting share gives these bytes back once the memory is freed
  budget_->used_ -= held_;
  held_ = 0;
  budget_->cv_.notify_all();
}

bool OutputBudget::Share::seal() {
  std::lock_guard lock(budget_->mu_);
  if (evicting_ || evicted_) return false;
  sealed_ = true;
  return true;
}

OutputBudget::Take OutputBudget::Share::take(uint64_t bytes) {
  OutputBudget& b = *budget_;
  std::unique_lock lock(b.mu_);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(b.wait_seconds_);
  auto giveWay = [&](Take why) {
    if (why == Take::kTooLarge) {
      ++b.too_large_;
    } else {
      ++b.refusals_;
    }
    if (owner_ != nullptr) evicted_ = true;
    return why;
  };
  for (;;) {
    if (evicting_ || evicted_) {
      ++b.refusals_;
      return Take::kBusy;
    }
    if (bytes == 0) return Take::kOk;
    if (held_ + bytes > b.capacity_) return giveWay(Take::kTooLarge);
    if (b.used_ + bytes <= b.capacity_) {
      b.used_ += bytes;
      held_ += bytes;
      b.peak_ = std::max(b.peak_, b.used_);
      return Take::kOk;
    }
    // Full. The largest evictable share other than this one, and what the evictable shares hold in all.
    Share* victim = nullptr;
    uint64_t evictable_total = 0;
    for (Share* s : b.shares_) {
      if (!s->evictable()) continue;
      evictable_total += s->held_;
      if (s != this && s->held_ > 0 && (victim == nullptr || s->held_ > victim->held_)) victim = s;
    }
    const uint64_t mine = evictable() ? held_ : 0;
    if (victim != nullptr && victim->held_ > mine) {
      victim->evicting_ = true;
      ++b.evictions_;
      lock.unlock();
      victim->owner_->evict();
      lock.lock();
      b.used_ -= victim->held_;
      victim->held_ = 0;
      victim->evicting_ = false;
      victim->evicted_ = true;
      b.cv_.notify_all();
      continue;
    }
    // This share is the largest evictable one, or none is. Bytes that are not evictable belong to responses
    // being written (or being evicted) and come back without anyone's help: wait for them if that is enough.
    const uint64_t coming_back = b.used_ - evictable_total;
    const uint64_t free_now = b.capacity_ - b.used_;
    if (free_now + coming_back < bytes) return giveWay(Take::kBusy);
    if (b.cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      if (b.used_ + bytes <= b.capacity_ && !evicting_ && !evicted_) continue;
      return giveWay(Take::kBusy);
    }
  }
}

uint64_t defaultOutputBudget(uint64_t node_memory_bytes) {
  constexpr uint64_t kMin = uint64_t{64} << 20;
  constexpr uint64_t kMax = uint64_t{1} << 30;
  return std::clamp<uint64_t>(node_memory_bytes / 16, kMin, kMax);
}

}  // namespace dsec::launcher

#include "dsec/launcher/node/StateStore.h"

#include <unistd.h>

#include <cerrno>

#include "dsec/common/Strings.h"
#include "dsec/launcher/node/Sessions.h"

namespace dsec::launcher {
namespace {

StoredState decodeStored(std::string id, const std::string& text) {
  StoredState s{std::move(id), decodeStateRecord(text), backendStateOf(text)};
  if (s.record.ok() && s.record->id != s.id) s.record = Error::invalid("the record names sandbox " + s.record->id);
  return s;
}

}  // namespace

Status FileStateStore::save(const SandboxStateRecord& record) {
  if (auto made = makeDirs(dir_, 0700); !made.ok()) return made.error().wrap("creating the state directory");
  return writeStateFile(pathOf(record.id), encodeStateRecord(record));
}

Status FileStateStore::remove(const std::string& id) {
  if (::unlink(pathOf(id).c_str()) != 0 && errno != ENOENT) return Error::sys(errno, "removing " + pathOf(id));
  return okStatus();
}

Result<std::vector<StoredState>> FileStateStore::loadAll() {
  if (auto made = makeDirs(dir_, 0700); !made.ok()) return made.error().wrap("creating the state directory");
  DSEC_ASSIGN_OR_RETURN(std::vector<std::string> files, listStateFiles(dir_));
  std::vector<StoredState> out;
  for (const auto& name : files) {
    std::string id = name.substr(0, name.size() - 5);
    auto text = readFile(dir_ + "/" + name);
    if (!text.ok()) {
      out.push_back({id, text.error(), nlohmann::json::object()});
      continue;
    }
    out.push_back(decodeStored(id, *text));
  }
  return out;
}

Status InMemoryStateStore::save(const SandboxStateRecord& record) {
  std::string text = encodeStateRecord(record);
  std::lock_guard lock(mu_);
  encoded_[record.id] = std::move(text);
  return okStatus();
}

Status InMemoryStateStore::remove(const std::string& id) {
  std::lock_guard lock(mu_);
  encoded_.erase(id);
  return okStatus();
}

Result<std::vector<StoredState>> InMemoryStateStore::loadAll() {
  std::lock_guard lock(mu_);
  std::vector<StoredState> out;
  for (const auto& [id, text] : encoded_) out.push_back(decodeStored(id, text));
  return out;
}

size_t InMemoryStateStore::size() {
  std::lock_guard lock(mu_);
  return encoded_.size();
}

}  // namespace dsec::launcher

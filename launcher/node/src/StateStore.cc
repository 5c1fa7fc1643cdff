#include "dsec/launcher/node/StateStore.h"

#include <unistd.h>

#include <cerrno>

#include "dsec/common/Directory.h"
#include "dsec/common/Strings.h"

namespace dsec::launcher {
namespace {

StoredState decodeStored(std::string id, const std::string& text) {
  StoredState s{std::move(id), decodeStateRecord(text), nlohmann::json::object()};
  if (s.record.ok() && s.record->id != s.id) s.record = Error::invalid("the record names sandbox " + s.record->id);
  if (s.record.ok()) {
    s.backend_state = s.record->backend_state;
  } else {
    s.backend_state = backendStateOf(text);  // what the backend needs to reap what is left of it
  }
  return s;
}

}  // namespace

Status FileStateStore::prepare() {
  if (auto made = makePrivateDir(dir_); !made.ok()) return made.error().wrap("creating the state directory");
  return okStatus();
}

Status FileStateStore::save(const SandboxStateRecord& record) {
  return writeStateFile(pathOf(record.id), encodeStateRecord(record));
}

Status FileStateStore::remove(const std::string& id) {
  if (::unlink(pathOf(id).c_str()) != 0 && errno != ENOENT) return Error::sys(errno, "removing " + pathOf(id));
  return okStatus();
}

Result<std::vector<StoredState>> FileStateStore::loadAll() {
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

Result<std::vector<std::string>> listStateFiles(const std::string& dir_path) {
  DSEC_ASSIGN_OR_RETURN(auto entries, listDirectory(dir_path));
  std::vector<std::string> files;
  for (auto& e : entries) {
    if (e.name.find(".tmp-") != std::string::npos) {
      ::unlink((dir_path + "/" + e.name).c_str());  // a write cut short by a crash
    } else if (e.name.size() > 5 && e.name.compare(e.name.size() - 5, 5, ".json") == 0) {
      files.push_back(std::move(e.name));
    }
  }
  return files;
}

}  // namespace dsec::launcher

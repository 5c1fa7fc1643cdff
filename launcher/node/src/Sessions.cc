#include "dsec/launcher/node/Sessions.h"

#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "dsec/common/Directory.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;
constexpr const char* kLog = "session";

bool nameChar(char c, bool first) {
  bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  return alnum || (!first && (c == '.' || c == '_' || c == '-'));
}

// A session file; its state is derived from lapsed_unix, so it is not written.
json sessionFileJson(const Session& s) {
  return json{{"name", s.name},
              {"lease", s.lease},
              {"retention", s.retention},
              {"expires_unix", s.expires_unix},
              {"lapsed_unix", s.lapsed_unix ? json(*s.lapsed_unix) : json(nullptr)},
              {"sandboxes", s.sandboxes}};
}

Result<Session> sessionFromJson(const json& j) {
  Session s;
  try {
    s.name = j.at("name").get<std::string>();
    s.lease = j.at("lease").get<double>();
    s.retention = j.at("retention").get<double>();
    s.expires_unix = j.at("expires_unix").get<double>();
    if (j.contains("lapsed_unix") && !j["lapsed_unix"].is_null()) s.lapsed_unix = j["lapsed_unix"].get<double>();
    for (const auto& id : j.value("sandboxes", json::array())) s.sandboxes.insert(id.get<std::string>());
  } catch (const json::exception& e) {
    return Error::invalid(std::string("bad session file: ") + e.what());
  }
  DSEC_TRY(validateSessionName(s.name));
  return s;
}

}  // namespace

Status validateSessionName(std::string_view name) {
  bool ok = !name.empty() && name.size() <= 64;
  for (size_t i = 0; ok && i < name.size(); ++i) ok = nameChar(name[i], i == 0);
  if (!ok) {
    std::string shown(name.substr(0, 80));
    for (char& c : shown) {
      if (static_cast<unsigned char>(c) < 0x20) c = '?';
    }
    return Error::invalid("invalid session name '" + shown +
                          "': it must match [A-Za-z0-9][A-Za-z0-9._-]{0,63} (1 to 64 characters)");
  }
  return okStatus();
}

SessionTable::SessionTable(std::string dir) : dir_(std::move(dir)) {}

Status SessionTable::load() {
  if (auto made = makePrivateDir(dir_); !made.ok()) return made.error().wrap("creating the session directory");
  DSEC_ASSIGN_OR_RETURN(std::vector<std::string> files, listStateFiles(dir_));
  std::lock_guard lock(mu_);
  for (const auto& file : files) {
    std::string path = dir_ + "/" + file;
    std::string name = file.substr(0, file.size() - 5);
    auto text = readFile(path);
    json j = text.ok() ? json::parse(*text, nullptr, false) : json();
    Result<Session> s = j.is_object() ? sessionFromJson(j) : Result<Session>(Error::invalid("not a JSON object"));
    if (s.ok() && s->name != name) s = Error::invalid("the file names session '" + s->name + "'");
    if (!s.ok()) {
      DSEC_LOG(kWarn, kLog) << "unreadable session file " << path << " (" << s.error().message() << "), removing it";
      ::unlink(path.c_str());
      continue;
    }
    sessions_[name] = std::move(*s);
  }
  if (!sessions_.empty()) DSEC_LOG(kInfo, kLog) << "loaded " << sessions_.size() << " session(s)";
  return okStatus();
}

Status SessionTable::persistLocked(const Session& s) {
  auto st = writeStateFile(pathOf(s.name), sessionFileJson(s).dump());
  if (!st.ok()) DSEC_LOG(kWarn, kLog) << "persisting session " << s.name << ": " << st.error().toString();
  return st;
}

void SessionTable::removeFileLocked(const std::string& name) {
  if (::unlink(pathOf(name).c_str()) != 0 && errno != ENOENT) {
    DSEC_LOG(kWarn, kLog) << "removing session file of " << name << ": " << strerror(errno);
  }
}

Result<Session> SessionTable::put(const std::string& name, const SessionSettings& settings, double now) {
  DSEC_TRY(validateSessionName(name));
  std::lock_guard lock(mu_);
  auto it = sessions_.find(name);
  bool created = it == sessions_.end();
  if (!created && it->second.deleting) {
    return Error(ErrorCode::kConflict, "session " + name + " is being deleted");
  }
  Session s = created ? Session{} : it->second;
  s.name = name;
  if (settings.lease) s.lease = *settings.lease;
  if (settings.retention) s.retention = *settings.retention;
  bool was_lapsed = s.lapsed();
  s.expires_unix = now + s.lease;
  s.lapsed_unix.reset();
  DSEC_TRY(persistLocked(s));
  sessions_[name] = s;
  if (created) {
    DSEC_LOG(kInfo, kLog) << "session " << name << " created (lease " << s.lease << " s, retention " << s.retention
                          << " s)";
  } else if (was_lapsed) {
    DSEC_LOG(kInfo, kLog) << "session " << name << " renewed after it lapsed";
  }
  return s;
}

Result<Session> SessionTable::renew(const std::string& name, std::optional<double> lease, double now) {
  DSEC_TRY(validateSessionName(name));
  std::lock_guard lock(mu_);
  auto it = sessions_.find(name);
  if (it == sessions_.end() || it->second.deleting) return Error::notFound("no session " + name);
  Session s = it->second;
  if (lease) s.lease = *lease;
  bool was_lapsed = s.lapsed();
  s.expires_unix = now + s.lease;
  s.lapsed_unix.reset();
  DSEC_TRY(persistLocked(s));
  it->second = s;
  if (was_lapsed) DSEC_LOG(kInfo, kLog) << "session " << name << " re-attached after it lapsed";
  return s;
}

Result<Session> SessionTable::get(const std::string& name) {
  DSEC_TRY(validateSessionName(name));
  std::lock_guard lock(mu_);
  auto it = sessions_.find(name);
  if (it == sessions_.end()) return Error::notFound("no session " + name);
  return it->second;
}

std::vector<Session> SessionTable::list() {
  std::lock_guard lock(mu_);
  std::vector<Session> out;
  for (const auto& [name, s] : sessions_) out.push_back(s);
  return out;
}

Status SessionTable::checkJoinable(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(name);
  if (it == sessions_.end())
    return Error::notFound("no session " + name + " (create it with PUT /v1/sessions/" + name + ")");
  if (it->second.deleting) return Error::notFound("session " + name + " is being deleted");
  if (it->second.lapsed()) {
    return Error(ErrorCode::kConflict,
                 "session " + name + " has lapsed (its lease was not renewed): attach to it before creating sandboxes");
  }
  return okStatus();
}

Status SessionTable::addSandbox(const std::string& name, const std::string& id) {
  DSEC_TRY(checkJoinable(name));
  std::lock_guard lock(mu_);
  auto it = sessions_.find(name);
  if (it == sessions_.end()) return Error::notFound("no session " + name);  // deleted in between
  Session s = it->second;
  s.sandboxes.insert(id);
  DSEC_TRY(persistLocked(s));
  it->second = std::move(s);
  return okStatus();
}

void SessionTable::removeSandbox(const std::string& name, const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(name);
  if (it == sessions_.end() || !it->second.sandboxes.erase(id)) return;
  // A failed write leaves the id in the file; the next restart's reconcile drops it.
  (void)persistLocked(it->second);
}

Result<std::vector<std::string>> SessionTable::beginDelete(const std::string& name) {
  DSEC_TRY(validateSessionName(name));
  std::lock_guard lock(mu_);
  auto it = sessions_.find(name);
  if (it == sessions_.end() || it->second.deleting) return Error::notFound("no session " + name);
  it->second.deleting = true;
  return std::vector<std::string>(it->second.sandboxes.begin(), it->second.sandboxes.end());
}

void SessionTable::erase(const std::string& name) {
  std::lock_guard lock(mu_);
  sessions_.erase(name);
  removeFileLocked(name);
}

void SessionTable::cancelDelete(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(name);
  if (it != sessions_.end()) it->second.deleting = false;
}

SessionTable::Due SessionTable::tick(double now) {
  Due due;
  std::lock_guard lock(mu_);
  for (auto& [name, s] : sessions_) {
    if (s.deleting) continue;
    std::vector<std::string> ids(s.sandboxes.begin(), s.sandboxes.end());
    if (!s.lapsed() && now >= s.expires_unix) {
      s.lapsed_unix = now;
      (void)persistLocked(s);
      lapses_total_++;
      DSEC_LOG(kInfo, kLog) << "session " << name << " lapsed (lease of " << s.lease << " s not renewed): pausing "
                            << ids.size() << " sandbox(es), keeping them for " << s.retention << " s";
      due.lapsed.emplace_back(name, std::move(ids));
    } else if (s.lapsed() && now >= *s.lapsed_unix + s.retention) {
      s.deleting = true;
      due.expired.emplace_back(name, std::move(ids));
    }
  }
  return due;
}

void SessionTable::reconcile(const std::map<std::string, std::string>& members, double now) {
  std::lock_guard lock(mu_);
  for (auto& [name, s] : sessions_) {
    bool changed = false;
    for (auto it = s.sandboxes.begin(); it != s.sandboxes.end();) {
      auto m = members.find(*it);
      if (m == members.end() || m->second != name) {
        DSEC_LOG(kInfo, kLog) << "session " << name << ": sandbox " << *it << " no longer exists";
        it = s.sandboxes.erase(it);
        changed = true;
      } else {
        ++it;
      }
    }
    if (changed) (void)persistLocked(s);
  }
  for (const auto& [id, name] : members) {
    auto it = sessions_.find(name);
    if (it == sessions_.end()) {
      if (!validateSessionName(name).ok()) continue;
      DSEC_LOG(kWarn, kLog) << "sandbox " << id << " belongs to session " << name
                            << ", which has no state: restoring the session with an expired lease";
      Session s;
      s.name = name;
      s.expires_unix = now;
      it = sessions_.emplace(name, std::move(s)).first;
    } else if (it->second.sandboxes.count(id)) {
      continue;
    }
    it->second.sandboxes.insert(id);
    (void)persistLocked(it->second);
  }
}

int64_t SessionTable::countActive() {
  std::lock_guard lock(mu_);
  int64_t n = 0;
  for (const auto& [name, s] : sessions_) n += s.lapsed() ? 0 : 1;
  return n;
}

int64_t SessionTable::countLapsed() {
  std::lock_guard lock(mu_);
  int64_t n = 0;
  for (const auto& [name, s] : sessions_) n += s.lapsed() ? 1 : 0;
  return n;
}

}  // namespace dsec::launcher

#include "dsec/launcher/api/Credentials.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "dsec/common/Fd.h"
#include "dsec/common/Logging.h"
#include "dsec/common/Strings.h"

namespace dsec::launcher {
namespace {

constexpr size_t kTokenHexLength = 64;  // 32 random bytes

bool validToken(const std::string& token) {
  return token.size() >= 16 && token.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos;
}

}  // namespace

Result<std::string> loadOrCreateToken(const std::string& root) {
  DSEC_TRY(makeDirs(root, 0755));
  const std::string path = root + "/token";
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto existing = readFile(path);
    if (existing.ok()) {
      std::string token = trim(*existing);
      if (validToken(token)) {
        struct stat st;
        if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0) ::chmod(path.c_str(), 0600);
        return token;
      }
      DSEC_LOG(kWarn, "node") << path << " holds no valid token; replacing it";
      ::unlink(path.c_str());
    }
    std::string token = randomHex(kTokenHexLength);
    std::string tmp = path + ".tmp." + randomHex(8);
    {
      UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
      if (!fd) return Error::sys(errno, "creating " + tmp);
      std::string text = token + "\n";
      if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) || ::fsync(fd.get()) != 0) {
        int err = errno;
        ::unlink(tmp.c_str());
        return Error::sys(err, "writing " + tmp);
      }
    }
    // link() fails if the token appeared meanwhile: then the other writer's token wins.
    int rc = ::link(tmp.c_str(), path.c_str());
    int err = errno;
    ::unlink(tmp.c_str());
    if (rc == 0) return token;
    if (err != EEXIST) return Error::sys(err, "creating " + path);
  }
  return Error::internal("could not create or read " + path);
}

Status validateFleetName(const std::string& name) {
  if (name.empty() || name.size() > 64 || name[0] == '.' ||
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") !=
          std::string::npos) {
    return Error::invalid("fleet name '" + name + "': use 1-64 of [A-Za-z0-9._-], not starting with '.'");
  }
  return okStatus();
}

std::string fleetFilePath(const std::string& name) {
  std::string home;
  if (const char* h = std::getenv("HOME"); h && *h) {
    home = h;
  } else if (struct passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_dir) {
    home = pw->pw_dir;
  } else {
    home = "/root";
  }
  return home + "/.dsec/fleets/" + name + ".json";
}

Status writeFleetFile(const std::string& name, const std::vector<std::string>& endpoints, const std::string& token,
                      const std::string& node, const std::string& root, const std::string& slurm_job) {
  DSEC_TRY(validateFleetName(name));
  if (endpoints.empty()) return Error::invalid("fleet " + name + ": no endpoint to write");
  std::string path = fleetFilePath(name);
  std::string dir = path.substr(0, path.rfind('/'));
  DSEC_TRY(makePrivateDir(dir));
  nlohmann::json j = {{"endpoint", endpoints.front()},
                      {"endpoints", endpoints},
                      {"token", token},
                      {"fleet", name},
                      {"node", node},
                      {"root", root}};
  if (!slurm_job.empty()) j["slurm_job"] = slurm_job;  // a --join agent takes over this job's sandboxes
  return writeFileAtomic(path, j.dump(2) + "\n", 0600);
}

void removeFleetFileIfOurs(const std::string& name, const std::string& endpoint) {
  if (!validateFleetName(name).ok()) return;
  std::string path = fleetFilePath(name);
  auto text = readFile(path);
  if (!text.ok()) return;
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_object() && j.value("endpoint", "") == endpoint) ::unlink(path.c_str());
}

}  // namespace dsec::launcher

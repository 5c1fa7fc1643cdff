// dsec bench fork --backend container: the source writes a workspace of random data (dd from /dev/urandom into
// /work, in several files), then POST .../fork {"count": N}, against the host's `cp -a` of the same tree N times
// (a local copy of the tree, fetched from the source as a tar, made first). A container fork shares the
// snapshot's layer; cp copies every byte.
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <iostream>

#include "BenchFork.h"
#include "Progress.h"
#include "dsec/common/Fd.h"
#include "dsec/common/FdIo.h"
#include "dsec/common/Process.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/HttpClient.h"

namespace dsec::cli {
namespace {

// The shell line the source runs: files of the workspace's size split evenly, the last taking the remainder.
std::string workspaceScript(int mib, int files) {
  std::string script = "mkdir -p /work";
  for (int i = 0; i < files; ++i) {
    int size = mib / files + (i == files - 1 ? mib % files : 0);
    script += " && dd if=/dev/urandom of=/work/f" + std::to_string(i) + " bs=1M count=" + std::to_string(size) +
              " 2>/dev/null";
  }
  return script;
}

// GET .../tar?path=/work into tar_path, then extracted into dir (created) by the host's tar.
Status fetchTree(const FleetAddress& address, const std::string& id, const std::string& tar_path,
                 const std::string& dir) {
  UniqueFd out(open(tar_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!out) return Error::sys(errno, "creating " + tar_path);
  launcher::client::CallOptions options;
  options.io_timeout_ms = 600 * 1000;
  Status written = okStatus();
  auto reply = launcher::client::callStreaming(address.endpoint, boost::beast::http::verb::get,
                                               "/v1/sandboxes/" + percentEncode(id) + "/tar?path=/work", address.token,
                                               "", options, [&](const char* data, size_t size) {
                                                 written = writeAll(out.get(), std::string_view(data, size), tar_path);
                                                 return written.ok();
                                               });
  if (!reply.ok()) return reply.error();
  if (reply->status / 100 != 2) return errorFromResponse(static_cast<unsigned>(reply->status), reply->body);
  DSEC_TRY(written);
  out.reset();
  DSEC_TRY(makeDirs(dir, 0700));
  // The tree is the sandbox's: no owners from it, nothing outside dir (GNU tar refuses ../ and absolute names).
  auto extracted =
      runCommandChecked({"tar", "-x", "--no-same-owner", "--no-same-permissions", "-f", tar_path, "-C", dir});
  if (!extracted.ok()) return extracted.error();
  unlink(tar_path.c_str());
  return okStatus();
}

int64_t freeBytes(const std::string& path) {
  struct statvfs fs {};
  if (statvfs(path.c_str(), &fs) != 0) return 0;
  return static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
}

double rounded(double v) { return std::round(v * 100) / 100; }

}  // namespace

int benchForkContainer(const Invocation& inv, const ForkBenchOptions& options) {
  auto target = openBenchTarget(options.target);
  if (!target.ok()) return reportError(inv, target.error());
  ApiClient client(target->address);
  const int count = options.count;
  const int64_t workspace_bytes = static_cast<int64_t>(options.workspace_mib) << 20;
  std::cout << "bench fork: " << count << " copies of a container sandbox holding " << options.workspace_mib
            << " MiB in " << options.workspace_files << " files, against " << count << " x cp -a; load "
            << loadAverages() << "\n";
  std::fflush(stdout);
  Progress progress("bench fork");
  std::vector<std::string> to_destroy;
  std::string snapshot;
  const std::string host_dir = options.target.root + "/bench-fork-" + randomHex(8);
  auto cleanup = [&] {
    for (const auto& id : to_destroy) (void)client.call(HttpMethod::kDelete, "/v1/sandboxes/" + percentEncode(id));
    if (!snapshot.empty()) (void)client.call(HttpMethod::kDelete, "/v1/snapshots/" + percentEncode(snapshot));
    (void)removeTree(host_dir);
    if (target->node) target->node->stop(true);
    progress.finish();
  };
  auto fail = [&](const Error& error) {
    cleanup();
    return reportError(inv, error);
  };

  progress.step("source: create and write the workspace", 1);
  // Room for the workspace on the sandbox's tmpfs upper, with its image's files and some slack.
  auto source =
      client.call(HttpMethod::kPost, "/v1/sandboxes",
                  {{"image", target->image}, {"backend", "container"}, {"disk", 2 * workspace_bytes + (256 << 20)}});
  if (!source.ok()) return fail(source.error());
  const std::string source_id = source->value("id", "");
  to_destroy.push_back(source_id);
  auto wrote = client.call(
      HttpMethod::kPost, "/v1/sandboxes/" + percentEncode(source_id) + "/exec",
      {{"cmd", {"sh", "-c", workspaceScript(options.workspace_mib, options.workspace_files)}}, {"timeout", 600}});
  if (!wrote.ok()) return fail(wrote.error());
  if (wrote->value("exit_code", -1) != 0) {
    return fail(Error::internal("writing the workspace failed: " + wrote->value("stderr", "")));
  }
  progress.advance();

  progress.step("a local copy of the workspace", 1);
  if (Status made = makeDirs(host_dir, 0700); !made.ok()) return fail(made.error());
  const std::string tree = host_dir + "/tree";
  if (Status fetched = fetchTree(target->address, source_id, host_dir + "/tree.tar", tree + "/work"); !fetched.ok()) {
    return fail(fetched.error());
  }
  progress.advance();

  progress.step("fork", 1);
  double f0 = monotonicSeconds();
  auto forked =
      client.call(HttpMethod::kPost, "/v1/sandboxes/" + percentEncode(source_id) + "/fork", {{"count", count}});
  double fork_ms = (monotonicSeconds() - f0) * 1000.0;
  if (!forked.ok()) return fail(forked.error());
  snapshot = forked->value("snapshot", nlohmann::json::object()).value("name", "");
  std::vector<std::string> copies;
  for (const auto& info : forked->value("sandboxes", nlohmann::json::array())) copies.push_back(info.value("id", ""));
  to_destroy.insert(to_destroy.end(), copies.begin(), copies.end());
  progress.advance();
  // One copy holds the workspace: its files, at their sizes.
  int64_t copy_bytes = 0;
  if (!copies.empty()) {
    auto listed =
        client.call(HttpMethod::kGet, "/v1/sandboxes/" + percentEncode(copies.back()) + "/files/list?path=/work");
    if (!listed.ok()) return fail(listed.error());
    for (const auto& entry : listed->value("entries", nlohmann::json::array()))
      copy_bytes += entry.value("size", int64_t{0});
  }

  // cp -a keeps every copy, as the forks do, while the disk has room; else each copy goes after it is timed.
  const bool keep_copies = freeBytes(host_dir) > static_cast<int64_t>(count + 2) * workspace_bytes;
  progress.step("cp -a of the workspace", count);
  double cp_seconds = 0;
  for (int i = 0; i < count; ++i) {
    std::string copy = host_dir + "/copy" + std::to_string(i);
    double c0 = monotonicSeconds();
    auto copied = runCommandChecked({"cp", "-a", tree, copy});
    cp_seconds += monotonicSeconds() - c0;
    if (!copied.ok()) return fail(copied.error());
    if (!keep_copies) (void)removeTree(copy);
    progress.advance();
  }
  cleanup();

  const double cp_ms = cp_seconds * 1000.0;
  std::printf("workspace %d MiB in %d files; a fork's copy holds %.1f MiB of it\n", options.workspace_mib,
              options.workspace_files, static_cast<double>(copy_bytes) / (1024.0 * 1024.0));
  std::printf("fork of %d: %.2f ms in all, %.2f ms per copy\n", count, fork_ms, fork_ms / count);
  std::printf("cp -a x %d: %.2f ms in all, %.2f ms per copy%s\n", count, cp_ms, cp_ms / count,
              keep_copies ? "" : " (each removed after it was timed: the disk has no room for all)");
  std::printf("cp -a / fork: %.2f\n", fork_ms > 0 ? cp_ms / fork_ms : 0.0);
  std::printf("load at the end: %s\n", loadAverages().c_str());
  nlohmann::json summary{{"backend", "container"},
                         {"count", count},
                         {"workspace_mib", options.workspace_mib},
                         {"fork_ms", rounded(fork_ms)},
                         {"fork_per_copy_ms", rounded(fork_ms / count)},
                         {"cp_ms", rounded(cp_ms)},
                         {"cp_per_copy_ms", rounded(cp_ms / count)},
                         {"cp_over_fork", fork_ms > 0 ? rounded(cp_ms / fork_ms) : 0.0},
                         {"copy_workspace_bytes", copy_bytes}};
  std::fflush(stdout);
  std::cout << summary.dump() << std::endl;
  return copy_bytes == workspace_bytes ? kExitOk : kExitFailure;
}

}  // namespace dsec::cli

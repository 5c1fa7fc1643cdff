// Node restarts: sandboxes outlive the agent and are re-adopted; what cannot be adopted is reaped.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <thread>

#include "ApiFixture.h"
#include "dsec/common/Directory.h"
#include "dsec/common/Strings.h"
#include "dsec/fs3/MountInfo.h"
#include "dsec/launcher/node/JobOwnership.h"
#include "dsec/launcher/node/NodeAgent.h"

namespace dsec::testing {
namespace {

using nlohmann::json;

TEST_F(ApiTest, RestartReadoptsRunningSandboxes) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  std::string id = createSandbox({{"labels", {{"keep", "yes"}}}});
  ASSERT_FALSE(id.empty());
  // Returns once the background process runs sleep (not a forked shell yet to exec it when the pause comes).
  ASSERT_EQ(exec(id, {{"cmd",
                       "echo state > /tmp/kept; sleep 1000 > /dev/null 2>&1 & "
                       "for i in $(seq 1000); do ps -o args | grep -q '^sleep 1000' && break; sleep 0.01; done"}})
                .json()["exit_code"],
            0);
  ASSERT_EQ(client_->request(boost::beast::http::verb::post, sandboxPath(id, "/pause")).status, 200);
  node_->stop(/*destroy_sandboxes=*/false);
  node_.reset();

  startNode();
  auto info = client_->get(sandboxPath(id));
  ASSERT_EQ(info.status, 200) << info.body;
  EXPECT_EQ(info.json()["labels"]["keep"], "yes");
  EXPECT_EQ(info.json()["state"], "paused");
  auto e = exec(id, {{"cmd", "cat /tmp/kept; ps -o args | grep -c '^sleep 1000'"}});
  ASSERT_EQ(e.status, 200) << e.body;
  EXPECT_EQ(e.json()["stdout"], "state\n1\n") << "the background process did not survive the restart";
  EXPECT_EQ(client_->get("/v1/sandboxes").json()["sandboxes"].size(), 1u);
  ASSERT_EQ(client_->del(sandboxPath(id)).status, 200);
}

TEST_F(ApiTest, RestartReapsDeadSandboxesAndJunkState) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  std::string alive = createSandbox();
  std::string dead = createSandbox();
  ASSERT_FALSE(alive.empty() || dead.empty());
  node_->stop(false);
  node_.reset();
  std::string state_dir = root_->path() + "/state/sandboxes/";
  auto state = json::parse(*readFile(state_dir + dead + ".json"));
  ASSERT_TRUE(state["backend_state"].contains("init_pid")) << state.dump();
  pid_t init = state["backend_state"]["init_pid"].get<pid_t>();
  ASSERT_EQ(::kill(init, SIGKILL), 0);
  for (int i = 0; i < 100 && ::kill(init, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_OK(writeFile(state_dir + "t0-garbage00000000.json", "{ not json"));
  ASSERT_OK(
      writeFile(state_dir + "t0-ffffffffffffffff.json",
                json{{"id", "t0-ffffffffffffffff"}, {"image", "busybox:1"}, {"backend_state", json::object()}}.dump()));

  startNode();
  EXPECT_EQ(client_->get(sandboxPath(alive)).status, 200);
  EXPECT_EQ(client_->get(sandboxPath(dead)).status, 404);
  EXPECT_NE(::access((state_dir + dead + ".json").c_str(), F_OK), 0) << "state of a dead sandbox kept";
  EXPECT_NE(::access((state_dir + "t0-garbage00000000.json").c_str(), F_OK), 0);
  EXPECT_NE(::access((state_dir + "t0-ffffffffffffffff.json").c_str(), F_OK), 0);
  EXPECT_EQ(::access((state_dir + alive + ".json").c_str(), F_OK), 0);
  EXPECT_EQ(client_->get("/v1/sandboxes").json()["sandboxes"].size(), 1u);
}

TEST_F(ApiTest, StopWithDestroyLeavesNothing) {
  startNode();
  SKIP_WITHOUT_BACKEND();
  std::string id = createSandbox();
  ASSERT_FALSE(id.empty());
  node_->stop(/*destroy_sandboxes=*/true);
  node_.reset();
  std::string state_dir = root_->path() + "/state/sandboxes/";
  EXPECT_NE(::access((state_dir + id + ".json").c_str(), F_OK), 0);
  startNode();
  EXPECT_EQ(client_->get("/v1/sandboxes").json()["sandboxes"].size(), 0u);
}

// Ownership by Slurm job (launcher/node/JobOwnership.h): a node whose options name a job, its claims in a
// registry of the test's own.
class JobOwnershipTest : public ApiTest {
 protected:
  launcher::ServeOptions jobOptions(const std::string& job) {
    launcher::ServeOptions o = options();
    o.node.slurm_job = job;
    o.node.job_registry_dir = registry_.path();
    return o;
  }
  std::string recordPath(const std::string& id) { return root_->path() + "/state/sandboxes/" + id + ".json"; }
  pid_t initOf(const std::string& id) {
    auto text = readFile(recordPath(id));
    if (!text.ok()) return 0;
    return json::parse(*text)["backend_state"].value("init_pid", 0);
  }
  // Dead: gone, or a zombie (the agent ran in this process, so the sandbox's init is this process's child).
  static bool dead(pid_t pid) {
    auto stat = readFile("/proc/" + std::to_string(pid) + "/stat");
    if (!stat.ok()) return true;
    auto paren = stat->rfind(')');
    return paren != std::string::npos && paren + 2 < stat->size() && (*stat)[paren + 2] == 'Z';
  }
  static bool gone(pid_t pid) {
    for (int i = 0; i < 3000 && !dead(pid); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return dead(pid);
  }
  // Cgroups left under the node's parent, layer mounts left under its root.
  std::string leftovers() {
    std::string out;
    std::string parent = launcher::cgroupParentForRoot(root_->path());
    auto hierarchies = listDirectory("/sys/fs/cgroup");
    if (::access(("/sys/fs/cgroup/" + parent).c_str(), F_OK) == 0) out += "cgroup " + parent + "; ";
    for (const auto& h : hierarchies.ok() ? *hierarchies : std::vector<DirEntry>{}) {
      if (::access(("/sys/fs/cgroup/" + h.name + "/" + parent).c_str(), F_OK) == 0) out += "cgroup " + h.name + "; ";
    }
    auto mounts = fs3::mountsUnder(root_->path() + "/mnt");
    for (const auto& m : mounts.ok() ? *mounts : std::vector<fs3::MountEntry>{}) out += "mount " + m.mount_point + "; ";
    return out;
  }
  TempDir registry_;
};

TEST_F(JobOwnershipTest, AnotherJobsSandboxesAreReapedNotAdopted) {
  ASSERT_TRUE(startNode(jobOptions("101")));
  SKIP_WITHOUT_BACKEND();
  std::string id = createSandbox();
  ASSERT_FALSE(id.empty());
  pid_t init = initOf(id);
  ASSERT_GT(init, 1);
  EXPECT_EQ(json::parse(*readFile(recordPath(id))).value("slurm_job", ""), "101");
  node_->stop(/*destroy_sandboxes=*/false);
  node_.reset();

  ASSERT_TRUE(startNode(jobOptions("102")));
  EXPECT_EQ(client_->get(sandboxPath(id)).status, 404) << "a sandbox of job 101 was adopted by job 102";
  EXPECT_TRUE(gone(init)) << "the sandbox of the ended job still runs";
  EXPECT_NE(::access(recordPath(id).c_str(), F_OK), 0);
}

TEST_F(JobOwnershipTest, ARunningJobsSandboxesAreTakenOverWhenAsked) {
  ASSERT_TRUE(startNode(jobOptions("201")));
  SKIP_WITHOUT_BACKEND();
  std::string id = createSandbox();
  ASSERT_FALSE(id.empty());
  node_->stop(false);
  node_.reset();

  // The same job again (an agent restarted inside its job): re-adopted, still the job's.
  ASSERT_TRUE(startNode(jobOptions("201")));
  ASSERT_EQ(client_->get(sandboxPath(id)).status, 200);
  node_->stop(false);
  node_.reset();
  // A --join agent of job 202 in the fleet of job 201: taken over; job 202 owns it from now on.
  launcher::ServeOptions joining = jobOptions("202");
  joining.node.adopt_jobs = {"201"};
  ASSERT_TRUE(startNode(joining));
  ASSERT_EQ(client_->get(sandboxPath(id)).status, 200);
  EXPECT_EQ(json::parse(*readFile(recordPath(id))).value("slurm_job", ""), "202");
  EXPECT_NE(::access((registry_.path() + "/201").c_str(), F_OK), 0) << "job 201 still claims the directory";
  EXPECT_EQ(exec(id, {{"cmd", "true"}}).json()["exit_code"], 0);
}

TEST_F(JobOwnershipTest, ASecondAgentOnTheSameDirectoryIsRefused) {
  ASSERT_TRUE(startNode(jobOptions("301")));
  SKIP_WITHOUT_BACKEND();
  launcher::ServeOptions second = jobOptions("302");
  second.http.listen = "127.0.0.1:0";
  auto other = launcher::EmbeddedNode::start(second);
  ASSERT_FALSE(other.ok()) << "two agents run on one node directory";
  EXPECT_EQ(other.error().code(), ErrorCode::kConflict) << other.error().toString();
  EXPECT_NE(other.error().message().find("Slurm job 301"), std::string::npos) << other.error().toString();
}

TEST_F(JobOwnershipTest, TheEpilogCleanUpLeavesNothingOfTheJob) {
  ASSERT_TRUE(startNode(jobOptions("401")));
  SKIP_WITHOUT_BACKEND();
  std::string a = createSandbox();
  std::string b = createSandbox({{"labels", {{"second", "1"}}}});
  ASSERT_FALSE(a.empty() || b.empty());
  ASSERT_EQ(exec(a, {{"cmd", "sleep 1000 > /dev/null 2>&1 &"}}).json()["exit_code"], 0);
  std::string host = launcher::currentHostName();
  // While the job's agent lives it holds the directory: the clean-up leaves it alone.
  auto early = launcher::cleanUpSlurmJob(registry_.path(), "401", host);
  ASSERT_OK(early);
  EXPECT_EQ(early->sandboxes, 0);
  ASSERT_EQ(client_->get(sandboxPath(a)).status, 200);
  pid_t init_a = initOf(a), init_b = initOf(b);
  // The agent dies without cleaning up (SIGKILL, node loss): its sandboxes keep running.
  node_->stop(false);
  node_.reset();
  ASSERT_FALSE(dead(init_a));
  // Another job's claim on this host is not touched.
  auto wrong_job = launcher::cleanUpSlurmJob(registry_.path(), "499", host);
  ASSERT_OK(wrong_job);
  EXPECT_EQ(wrong_job->sandboxes, 0);
  EXPECT_FALSE(dead(init_a));
  EXPECT_FALSE(launcher::cleanUpSlurmJob(registry_.path(), "4x1", host).ok()) << "a job id that is not a number";

  auto report = launcher::cleanUpSlurmJob(registry_.path(), "401", host);
  ASSERT_OK(report);
  EXPECT_EQ(report->directories, 1);
  EXPECT_EQ(report->sandboxes, 2);
  EXPECT_TRUE(gone(init_a) && gone(init_b)) << "a sandbox of the ended job still runs";
  EXPECT_NE(::access(recordPath(a).c_str(), F_OK), 0);
  EXPECT_NE(::access(recordPath(b).c_str(), F_OK), 0);
  EXPECT_EQ(leftovers(), "");
  EXPECT_NE(::access((registry_.path() + "/401").c_str(), F_OK), 0) << "the job's claim is still there";
  // Idempotent, and the next agent of another job starts on a clean directory.
  auto again = launcher::cleanUpSlurmJob(registry_.path(), "401", host);
  ASSERT_OK(again);
  EXPECT_EQ(again->directories, 0);
  ASSERT_TRUE(startNode(jobOptions("402")));
  EXPECT_EQ(client_->get("/v1/sandboxes").json()["sandboxes"].size(), 0u);
}

// The epilog runs as root and destroys what a claim names: a claim file some other user could have written (or a
// symbolic link to one), or one naming a node directory another user may change, is refused with a note, and what
// it names keeps running.
TEST_F(JobOwnershipTest, AClaimAnotherUserCouldHaveWrittenIsNotActedOn) {
  ASSERT_TRUE(startNode(jobOptions("451")));
  SKIP_WITHOUT_BACKEND();
  std::string id = createSandbox();
  ASSERT_FALSE(id.empty());
  pid_t init = initOf(id);
  node_->stop(false);
  node_.reset();
  std::string host = launcher::currentHostName();
  auto claims = listDirectory(registry_.path() + "/451");
  ASSERT_OK(claims);
  ASSERT_EQ(claims->size(), 1u);
  std::string claim = registry_.path() + "/451/" + (*claims)[0].name;

  ASSERT_EQ(::chown(claim.c_str(), 65534, 65534), 0);
  auto foreign = launcher::cleanUpSlurmJob(registry_.path(), "451", host);
  ASSERT_OK(foreign);
  EXPECT_EQ(foreign->sandboxes, 0) << "a claim owned by another user was acted on";
  ASSERT_EQ(foreign->notes.size(), 1u);
  EXPECT_FALSE(dead(init));

  std::string planted = registry_.path() + "/planted.json";
  ASSERT_EQ(::rename(claim.c_str(), planted.c_str()), 0);
  ASSERT_EQ(::chown(planted.c_str(), 0, 0), 0);
  ASSERT_EQ(::symlink(planted.c_str(), claim.c_str()), 0);
  auto linked = launcher::cleanUpSlurmJob(registry_.path(), "451", host);
  ASSERT_OK(linked);
  EXPECT_EQ(linked->sandboxes, 0) << "a claim behind a symbolic link was acted on";
  EXPECT_FALSE(dead(init));

  // A good claim naming a node directory another user may write (they could plant the records it is read by).
  ASSERT_EQ(::unlink(claim.c_str()), 0);
  ASSERT_EQ(::rename(planted.c_str(), claim.c_str()), 0);
  struct stat dir_stat {};
  ASSERT_EQ(::stat(root_->path().c_str(), &dir_stat), 0);
  ASSERT_EQ(::chmod(root_->path().c_str(), 0777), 0);
  auto loose = launcher::cleanUpSlurmJob(registry_.path(), "451", host);
  ASSERT_EQ(::chmod(root_->path().c_str(), dir_stat.st_mode & 07777), 0);
  ASSERT_OK(loose);
  EXPECT_EQ(loose->sandboxes, 0) << "the records of a node directory others may write were acted on";
  EXPECT_FALSE(dead(init));

  // The control: the same claim, in place and root's, on a directory only root may change, cleans up.
  auto report = launcher::cleanUpSlurmJob(registry_.path(), "451", host);
  ASSERT_OK(report);
  EXPECT_EQ(report->sandboxes, 1);
  EXPECT_TRUE(gone(init));
}

}  // namespace
}  // namespace dsec::testing

// dsec-launch's command line (LaunchOptions.h): every node flag of the shared table reaches the node's options as
// it does for `dsec serve`, the fleet's own flags parse, bad values are refused naming the flag, and both fronts
// default alike. The gateway process's config file round-trips.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "../launcher/NodeFlagCases.h"
#include "dsec/common/Strings.h"
#include "dsec/launcher/api/NodeOptionTable.h"
#include "dsec/launcher/fleet/GatewayProcess.h"
#include "dsec/launcher/fleet/LaunchNode.h"
#include "dsec/launcher/fleet/LaunchOptions.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::launcher::fleet {
namespace {

// DSEC_FLEET and DSEC_ROOT unset for the test (restored after).
class LaunchOptionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"DSEC_FLEET", "DSEC_ROOT"}) {
      const char* v = std::getenv(name);
      saved_.push_back({name, v ? std::optional<std::string>(v) : std::nullopt});
      ::unsetenv(name);
    }
  }
  void TearDown() override {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());  // a test set it: it must not reach the next one
      }
    }
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST_F(LaunchOptionsTest, EveryNodeFlagReachesTheNodeOptions) {
  for (const auto& c : everyNodeFlag(/*with_serve_only=*/false)) {
    auto o = parseLaunchOptions(c.args);
    ASSERT_TRUE(o.ok()) << c.args[0] << ": " << o.error().message();
    EXPECT_TRUE(c.holds(o->serve)) << c.args[0];
    auto defaults = parseLaunchOptions({});
    ASSERT_OK(defaults);
    EXPECT_FALSE(c.holds(defaults->serve)) << c.args[0] << " holds by default: the case tests nothing";
  }
}

TEST_F(LaunchOptionsTest, DensityQosAndFncallFlagsReachTheNode) {
  auto o = parseLaunchOptions({"--overcommit", "off", "--memory-capacity", "2G", "--cpu-qos", "off",
                               "--cpu-exclusive-pool", "off", "--fncall-workers", "0", "--fncall-queue-wait", "1",
                               "--fncall-image", "alpine:3", "--memory-ratio-max", "16", "--simulate"});
  ASSERT_OK(o);
  const NodeOptions& n = o->serve.node;
  EXPECT_FALSE(n.density.overcommit);
  EXPECT_EQ(n.memory_capacity_bytes, int64_t{2} << 30);
  EXPECT_FALSE(n.cpu_qos);
  EXPECT_FALSE(n.cpu_exclusive_pool);
  EXPECT_EQ(n.fncall.max_workers, 0);
  EXPECT_EQ(n.fncall.queue_wait_seconds, 1);
  EXPECT_EQ(n.fncall.image, "alpine:3");
  EXPECT_EQ(n.density.memory_ratio_max, 16);
  EXPECT_TRUE(n.simulate);
}

TEST_F(LaunchOptionsTest, FleetFlagsParse) {
  auto o = parseLaunchOptions({"--fleet",      "eval",   "--root",          "/srv/dsec",
                               "--state-dir",  "/srv/n", "--port",          "9000",
                               "--node-port",  "9001",   "--address",       "10.0.0.5",
                               "--node-name",  "Node_1", "--drain-timeout", "5",
                               "--lost-after", "2",      "--no-mpi",        "--gateway-run-code-listen",
                               "10.0.0.5:8472"});
  ASSERT_OK(o);
  EXPECT_EQ(o->serve.node.fleet_name, "eval");
  EXPECT_EQ(o->serve.node.root, "/srv/dsec");
  EXPECT_EQ(o->state_dir, "/srv/n");
  EXPECT_EQ(o->port, 9000);
  EXPECT_EQ(o->node_port, 9001);
  EXPECT_EQ(o->address, "10.0.0.5");
  EXPECT_EQ(o->node_name, "Node_1");  // made safe when the node starts
  EXPECT_EQ(safeNodeName(o->node_name), "node-1");
  EXPECT_EQ(o->drain_timeout, 5);
  EXPECT_EQ(o->lost_after, 2);
  EXPECT_EQ(o->gateways, 3);  // gateway candidates: ranks 0..2
  EXPECT_EQ(parseLaunchOptions({"--gateways", "2"})->gateways, 2);
  EXPECT_TRUE(o->no_mpi);
  EXPECT_FALSE(o->serve.write_fleet_file);
  EXPECT_EQ(o->gateway_run_code_listen, "10.0.0.5:8472");
  EXPECT_EQ(parseLaunchOptions({})->gateway_run_code_listen, "");  // none unless asked for
  auto e2b =
      parseLaunchOptions({"--gateway-e2b-listen", "10.0.0.5:8473", "--gateway-e2b-template", "agent=debian:12",
                          "--gateway-e2b-template", "swe=debian:12+swe:1", "--gateway-e2b-default-image", "debian:12"});
  ASSERT_OK(e2b);
  EXPECT_EQ(e2b->gateway_e2b.listen, "10.0.0.5:8473");
  EXPECT_EQ(e2b->gateway_e2b.templates.at("swe"), "debian:12+swe:1");
  EXPECT_EQ(e2b->gateway_e2b.default_image, "debian:12");
  EXPECT_TRUE(parseLaunchOptions({})->gateway_e2b.listen.empty());

  auto join = parseLaunchOptions({"--join", "rollout", "--drain-timeout", "10"});
  ASSERT_OK(join);
  EXPECT_EQ(join->join, "rollout");
  EXPECT_EQ(join->serve.node.fleet_name, "rollout");
  auto by_name = parseLaunchOptions({"--fleet-name", "eval"});
  ASSERT_OK(by_name);
  EXPECT_EQ(by_name->serve.node.fleet_name, "eval");
  auto gateway = parseLaunchOptions({"--gateway-only", "--fleet", "eval", "--gateway-config", "/x/gw.json"});
  ASSERT_OK(gateway);
  EXPECT_TRUE(gateway->gateway_only);
  EXPECT_EQ(gateway->gateway_config, "/x/gw.json");
  auto help = parseLaunchOptions({"--help"});
  ASSERT_OK(help);
  EXPECT_TRUE(help->help);
  std::string usage = launchUsage();
  for (const char* flag : {"--fleet", "--join", "--gateway-config", "--cpu-qos", "--overcommit", "--fncall-image",
                           "--max-connections", "--body-min-rate"}) {
    EXPECT_NE(usage.find(flag), std::string::npos) << flag;
  }
}

TEST_F(LaunchOptionsTest, BadValuesAreRefusedNamingTheFlag) {
  for (const char* arg_text :
       {"--port=70000", "--node-port=-1", "--drain-timeout=-1", "--lost-after=0.1", "--gateways=0", "--gateways=17",
        "--max-sandboxes=0", "--cpu-qos=maybe", "--overcommit=x", "--fncall-workers=-2", "--memory-capacity=lots",
        "--header-timeout=0", "--fleet=../etc", "--max-sandboxes=1e3", "--port=99999999999",
        "--gateway-run-code-listen=nowhere", "--gateway-e2b-listen=nowhere", "--gateway-e2b-template=agent",
        "--gateway-e2b-default-image=../x"}) {
    std::string arg = arg_text;
    auto o = parseLaunchOptions({arg});
    ASSERT_FALSE(o.ok()) << arg << " was taken";
    std::string flag = arg.substr(0, arg.find('='));
    if (flag == "--fleet") flag = "--fleet-name";  // the table checks the name, whichever flag gave it
    EXPECT_NE(o.error().message().find(flag), std::string::npos) << arg << ": " << o.error().message();
  }
  auto unknown = parseLaunchOptions({"--no-such-flag"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message().find("--no-such-flag"), std::string::npos) << unknown.error().message();
  auto conflict = parseLaunchOptions({"--fleet", "a", "--fleet-name", "b"});
  ASSERT_FALSE(conflict.ok());
  EXPECT_NE(conflict.error().message().find("--fleet"), std::string::npos);
  EXPECT_FALSE(parseLaunchOptions({"--gateway-only"}).ok());  // no config file
}

// The gateway has no admission ratio of its own: a ratio asked for there is refused, saying whose it is.
TEST_F(LaunchOptionsTest, GatewayAdmissionRatiosAreRefused) {
  for (const char* flag : {"--cpu-overcommit", "--memory-overcommit"}) {
    for (const char* value : {"8", "1"}) {
      auto o = parseLaunchOptions({flag, value});
      ASSERT_FALSE(o.ok()) << flag << " " << value << " was taken";
      const std::string& message = o.error().message();
      EXPECT_NE(message.find(std::string(flag) + " is refused"), std::string::npos) << message;
      EXPECT_NE(message.find("admission is each node's"), std::string::npos) << message;
      EXPECT_NE(message.find(std::string(flag) == "--cpu-overcommit" ? "--cpu-ratio-max" : "--memory-ratio-max"),
                std::string::npos)
          << message;
    }
  }
  EXPECT_EQ(launchUsage().find("--cpu-overcommit"), std::string::npos);
}

TEST_F(LaunchOptionsTest, DefaultsAreDsecServes) {
  auto o = parseLaunchOptions({});
  ASSERT_OK(o);
  ServeOptions serve;  // what `dsec serve` starts from (the table leaves the structs' defaults)
  EXPECT_EQ(o->serve.node.fleet_name, kDefaultFleetName);
  EXPECT_EQ(o->serve.node.fleet_name, serve.node.fleet_name);
  EXPECT_EQ(o->serve.node.root, "/var/lib/dsec");
  EXPECT_EQ(o->serve.node.max_sandboxes, serve.node.max_sandboxes);
  EXPECT_EQ(o->serve.node.fncall.image, serve.node.fncall.image);
  EXPECT_EQ(o->serve.node.fncall.max_workers, serve.node.fncall.max_workers);
  EXPECT_EQ(o->serve.node.density.overcommit, serve.node.density.overcommit);
  EXPECT_EQ(o->serve.node.density.memory_ratio_start, serve.node.density.memory_ratio_start);
  EXPECT_EQ(o->serve.node.cpu_qos, serve.node.cpu_qos);
  EXPECT_EQ(o->serve.node.cpu_exclusive_pool, serve.node.cpu_exclusive_pool);
  EXPECT_EQ(o->serve.node.user_namespaces, serve.node.user_namespaces);
  EXPECT_EQ(o->serve.node.memory_capacity_bytes, serve.node.memory_capacity_bytes);
  EXPECT_EQ(o->serve.http.max_connections, serve.http.max_connections);
  EXPECT_EQ(o->serve.http.header_timeout_seconds, serve.http.header_timeout_seconds);
  EXPECT_EQ(o->serve.http.body_min_rate, serve.http.body_min_rate);
  EXPECT_EQ(o->serve.output_budget_bytes, serve.output_budget_bytes);

  ::setenv("DSEC_FLEET", "from-env", 1);
  auto env = parseLaunchOptions({});
  ASSERT_OK(env);
  EXPECT_EQ(env->serve.node.fleet_name, "from-env");
}

TEST(GatewayConfig, RoundTripsWithMode0600) {
  dsec::testing::TempDir dir;
  GatewayProcessConfig c;
  c.fleet_name = "eval";
  c.token_file = dir.path() + "/fleet-token";
  c.seed_file = dir.path() + "/fleet-nodes.json";
  c.port_file = dir.path() + "/gateway-port";
  c.address = "10.0.0.1";
  c.port = 8471;
  c.lost_after_seconds = 2.7;
  c.http.max_connections = 77;
  c.http.max_client_connections = 5;
  c.http.client_queue_seconds = 0.3;
  c.http.header_timeout_seconds = 0.1;
  c.http.body_timeout_seconds = 12.345678901;
  c.http.body_min_rate = 1000.5;
  c.http.idle_timeout_ms = 4321;
  c.http.header_limit = 12345;
  c.run_code_listen = "10.0.0.1:8472";
  c.e2b.listen = "10.0.0.1:8473";
  c.e2b.templates = {{"agent", "debian:12+python:3.11"}, {"swe", "debian:12"}};
  c.e2b.default_image = "debian:12";
  std::string path = dir.path() + "/gateway-config.json";
  ASSERT_OK(writeGatewayConfig(path, c));
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  auto back = readGatewayConfig(path);
  ASSERT_OK(back);
  EXPECT_TRUE(*back == c);
  EXPECT_EQ(gatewayHttpOptions(*back).listen, "10.0.0.1:8471");
}

TEST(GatewayConfig, RefusesBadFiles) {
  dsec::testing::TempDir dir;
  std::string path = dir.path() + "/gateway-config.json";
  auto write = [&](const char* text) { return writeFileAtomic(path, text, 0600); };
  EXPECT_FALSE(readGatewayConfig(path).ok());  // missing
  ASSERT_OK(write("not json"));
  EXPECT_FALSE(readGatewayConfig(path).ok());
  ASSERT_OK(write(R"({"fleet_name": "f", "token_file": "/t", "port": "eighty"})"));
  auto typed = readGatewayConfig(path);
  ASSERT_FALSE(typed.ok());
  EXPECT_NE(typed.error().message().find("port"), std::string::npos) << typed.error().message();
  ASSERT_OK(write(R"({"fleet_name": "f", "token_file": "/t", "max_connections": 0})"));
  EXPECT_FALSE(readGatewayConfig(path).ok());
  ASSERT_OK(write(R"({"fleet_name": "f", "token_file": "/t", "cpu_overcommit": 8})"));
  auto ratio = readGatewayConfig(path);
  ASSERT_FALSE(ratio.ok());
  EXPECT_NE(ratio.error().message().find("cpu_overcommit is refused: admission is each node's"), std::string::npos)
      << ratio.error().message();
  ASSERT_OK(write(R"({"fleet_name": "f", "token_file": "/t"})"));
  EXPECT_OK(readGatewayConfig(path));
  // The same settings readable by others are not trusted (tests/security/GatewayConfigTrustTest.cc has the rest).
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  auto loose = readGatewayConfig(path);
  ASSERT_FALSE(loose.ok());
  EXPECT_NE(loose.error().message().find("0600"), std::string::npos) << loose.error().message();
}

}  // namespace
}  // namespace dsec::launcher::fleet

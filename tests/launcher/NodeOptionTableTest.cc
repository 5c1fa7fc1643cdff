// The node option table (NodeOptionTable.h) as `dsec serve` uses it: every flag reaches ServeOptions, bad values
// are refused naming the flag. dsec-launch's use of it: tests/fleet/LaunchOptionsTest.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "NodeFlagCases.h"
#include "dsec/launcher/api/NodeOptionTable.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::launcher {
namespace {

namespace po = boost::program_options;

// `dsec serve`'s use of the table: --root comes from the common options, so it is not the table's.
Status parseServe(const std::vector<std::string>& args, ServeOptions* options) {
  options->node.root = "/tmp/dsec-root";
  NodeOptionTable table(options, {.root = false, .listen = true});
  po::options_description desc;
  table.addTo(desc);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    return Error::invalid(e.what());
  }
  return table.apply(vm);
}

TEST(NodeOptionsTable, EveryServeFlagReachesTheOptions) {
  for (const auto& c : everyNodeFlag(/*with_serve_only=*/true)) {
    ServeOptions o;
    Status st = parseServe(c.args, &o);
    ASSERT_TRUE(st.ok()) << c.args[0] << ": " << st.error().message();
    EXPECT_TRUE(c.holds(o)) << c.args[0];
    // Nothing else changed: the same flag missing leaves the default, which the check does not hold for.
    ServeOptions defaults;
    ASSERT_TRUE(parseServe({}, &defaults).ok());
    EXPECT_FALSE(c.holds(defaults)) << c.args[0] << " holds by default: the case tests nothing";
  }
}

// A flag added to the table without a case would reach neither front's test: every flag has one.
TEST(NodeOptionsTable, EveryFlagOfTheTableHasACase) {
  ServeOptions o;
  NodeOptionTable table(&o, {.root = false, .listen = true});
  po::options_description desc;
  table.addTo(desc);
  auto cases = everyNodeFlag(/*with_serve_only=*/true);
  ASSERT_FALSE(desc.options().empty());
  for (const auto& option : desc.options()) {
    std::string flag = "--" + option->long_name();
    bool covered = std::any_of(cases.begin(), cases.end(), [&](const FlagCase& c) { return c.args[0] == flag; });
    EXPECT_TRUE(covered) << flag << " has no case in NodeFlagCases.h";
  }
}

TEST(NodeOptionsTable, DefaultsAreTheStructs) {
  ServeOptions o;
  ASSERT_TRUE(parseServe({}, &o).ok());
  NodeOptions node;
  HttpServerOptions http = defaultServeHttpOptions();
  EXPECT_EQ(o.node.fleet_name, kDefaultFleetName);
  EXPECT_EQ(o.node.node_name, node.node_name);
  EXPECT_EQ(o.node.max_sandboxes, node.max_sandboxes);
  EXPECT_EQ(o.node.fncall.image, node.fncall.image);
  EXPECT_EQ(o.node.density.overcommit, node.density.overcommit);
  EXPECT_EQ(o.node.cpu_qos, node.cpu_qos);
  EXPECT_EQ(o.node.user_namespaces, node.user_namespaces);
  EXPECT_EQ(o.http.listen, "127.0.0.1:8470");
  EXPECT_EQ(o.http.max_connections, http.max_connections);
  EXPECT_EQ(o.http.body_min_rate, http.body_min_rate);
  EXPECT_EQ(o.http.idle_timeout_ms, http.idle_timeout_ms);
  EXPECT_EQ(o.output_budget_bytes, 0u);
}

TEST(NodeOptionsTable, BadValuesAreRefusedNamingTheFlag) {
  // "--flag=value", so a value that starts with '-' is the flag's.
  const std::vector<std::string> bad = {
      "--max-sandboxes=0",
      "--max-sandboxes=-3",
      "--max-sandboxes=99999999999999999999",  // over int64
      "--max-connections=3000000000",          // over int
      "--max-connections=0",
      "--max-client-connections=-1",
      "--header-timeout=0",
      "--header-timeout=inf",
      "--body-timeout=nan",
      "--body-timeout=ten",
      "--body-min-rate=fast",
      "--body-min-rate=0",
      "--body-min-rate=99999999999999999999999G",
      "--output-budget=1k",
      "--memory-capacity=-1G",
      "--egress-never=pypi.org",
      "--egress-never=10.0.0.1/8",
      "--egress-never=10.0.0.0/8:443",
      "--idle-timeout=1e10",
      "--client-queue-wait=-1",
      "--overcommit=maybe",
      "--cpu-qos=yes",
      "--cpu-exclusive-pool=1",
      "--user-namespaces=no",
      "--fncall-workers=-1",
      "--fncall-queue-wait=-0.5",
      "--fncall-image=",
      "--run-code-listen=nowhere",
      "--run-code-listen=127.0.0.1:8470",  // the API's own address
      "--run-code-cpp-image=",
      "--memory-ratio-start=100",
      "--memory-ratio-min=0",
      "--cpu-ratio-max=0.5",
      "--reaper-interval=0",
      "--density-interval=-1",
      "--cgroup-parent=../escape",
      "--store=/nonexistent/dsec-store",  // the shared store must be a directory the node reads
      "--store=http://",                  // a chunk server's URL needs a host and port
      "--e2b-template=agent",             // NAME=IMAGE
      "--e2b-template=agent=../x",        // not an image
      "--e2b-default-image=../x",
      "--e2b-listen=8496",  // no host
      "--chunk-cache=lots",
      "--listen=8470",
      "--listen=127.0.0.1:70000",
      "--fleet-name=../x",
      "--node-name=Bad_Name",
  };
  for (const auto& arg : bad) {
    ServeOptions o;
    Status st = parseServe({arg}, &o);
    ASSERT_FALSE(st.ok()) << arg << " was taken";
    std::string flag = arg.substr(0, arg.find('='));
    EXPECT_NE(st.error().message().find(flag), std::string::npos) << arg << ": " << st.error().message();
  }
}

TEST(NodeOptionsTable, ValidateNamesTheFlagOfAValueSetInCode) {
  ServeOptions o;
  o.node.root = "/tmp/x";
  EXPECT_TRUE(validateNodeFlags(o).ok());
  o.http.body_timeout_seconds = 0;
  Status st = validateNodeFlags(o);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message().find("--body-timeout"), std::string::npos) << st.error().message();
}

}  // namespace
}  // namespace dsec::launcher

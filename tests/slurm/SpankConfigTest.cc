// The SPANK plugin's parsing and naming, without Slurm: plugstack.conf arguments, --dsec-* options with their
// environment defaults, mount lists and sandbox ids.
#include <gtest/gtest.h>

#include <map>

#include "SpankConfig.h"
#include "StepSandbox.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::spank {
namespace {

EnvLookup envOf(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(PluginArgs, DefaultsAndKnownKeys) {
  auto none = parsePluginArgs({});
  ASSERT_OK(none);
  EXPECT_EQ(none->root, "/var/lib/dsec");
  EXPECT_EQ(none->backend, "container");
  EXPECT_EQ(none->cgroup_parent, "dsec-spank");
  EXPECT_EQ(none->network, backends::NetworkMode::kNone);

  auto all = parsePluginArgs(
      {"root=/srv/dsec", "backend=container", "cgroup_parent=batch/dsec", "init=/opt/init", "network=host", "disk=2G"});
  ASSERT_OK(all);
  EXPECT_EQ(all->root, "/srv/dsec");
  EXPECT_EQ(all->cgroup_parent, "batch/dsec");
  EXPECT_EQ(all->init_path, "/opt/init");
  EXPECT_EQ(all->network, backends::NetworkMode::kHost);
  EXPECT_EQ(all->disk_bytes, 2LL << 30);
}

TEST(PluginArgs, UnknownKeyIsAnErrorNamingIt) {
  auto r = parsePluginArgs({"root=/x", "rootdir=/y"});
  ASSERT_ERROR(r, ErrorCode::kInvalidArgument);
  EXPECT_NE(r.error().message().find("'rootdir'"), std::string::npos) << r.error().message();
}

TEST(PluginArgs, BadValuesAreErrors) {
  for (std::vector<std::string> args : std::vector<std::vector<std::string>>{{"root"},
                                                                             {"=x"},
                                                                             {"root=relative"},
                                                                             {"backend=vm"},
                                                                             {"cgroup_parent=/abs"},
                                                                             {"cgroup_parent=a/../b"},
                                                                             {"network=bridge"},
                                                                             {"disk=lots"},
                                                                             {"init=x"}}) {
    EXPECT_FALSE(parsePluginArgs(args).ok()) << args[0];
  }
}

TEST(Mounts, ParsesListsAndFlags) {
  auto m = parseMounts("/data:/mnt/data:ro,/scratch:/scratch,/home/u:/home/u:rw");
  ASSERT_OK(m);
  ASSERT_EQ(m->size(), 3u);
  EXPECT_EQ((*m)[0], (MountSpec{"/data", "/mnt/data", true}));
  EXPECT_EQ((*m)[1], (MountSpec{"/scratch", "/scratch", false}));
  EXPECT_EQ((*m)[2], (MountSpec{"/home/u", "/home/u", false}));
  EXPECT_EQ(mountsToString(*m), "/data:/mnt/data:ro,/scratch:/scratch,/home/u:/home/u");
}

TEST(Mounts, RejectsBadSpecs) {
  for (const char* bad :
       {"", "/a", "a:/b", "/a:b", "/a:/b:rx", "/a:/b:ro:x", "/a:/", "/a:/x/../y", "/a/../b:/c", ","}) {
    EXPECT_FALSE(parseMounts(bad).ok()) << bad;
  }
}

TEST(Options, CommandLineWinsOverEnvironment) {
  RawOptions raw;
  raw.set(OptionId::kImage, "debian:12+python:3.11");
  raw.set(OptionId::kMem, "512M");
  auto r = resolveOptions(raw, envOf({{"DSEC_IMAGE", "other:1"}, {"DSEC_WORKDIR", "/work"}, {"DSEC_NET", "host"}}),
                          PluginArgs{});
  ASSERT_OK(r);
  EXPECT_EQ(r->image, "debian:12+python:3.11");
  EXPECT_EQ(r->memory_bytes, 512LL << 20);
  EXPECT_EQ(r->workdir, "/work");
  EXPECT_EQ(r->network, backends::NetworkMode::kHost);
  EXPECT_EQ(r->backend, "container");
}

TEST(Options, NothingGivenMeansNoSandbox) {
  auto r = resolveOptions(RawOptions{}, envOf({}), PluginArgs{});
  ASSERT_OK(r);
  EXPECT_TRUE(r->image.empty());
  EXPECT_EQ(r->workdir, "/");
  EXPECT_EQ(r->memory_bytes, 0);
}

TEST(Options, PluginDefaultNetworkApplies) {
  PluginArgs args;
  args.network = backends::NetworkMode::kHost;
  auto r = resolveOptions(RawOptions{}, envOf({{"DSEC_IMAGE", "a:1"}}), args);
  ASSERT_OK(r);
  EXPECT_EQ(r->network, backends::NetworkMode::kHost);
}

TEST(Options, RepeatedMountsAreAllKept) {
  RawOptions raw;
  raw.set(OptionId::kMount, "/a:/a");
  raw.set(OptionId::kMount, "/b:/b:ro,/c:/c");
  auto r = resolveOptions(raw, envOf({{"DSEC_MOUNT", "/env:/env"}}), PluginArgs{});
  ASSERT_OK(r);
  ASSERT_EQ(r->mounts.size(), 3u);
  EXPECT_EQ(r->mounts[0].source, "/a");
  EXPECT_EQ(r->mounts[2].source, "/c");
}

TEST(Options, BadEnvironmentValueNamesTheVariable) {
  auto r = resolveOptions(RawOptions{}, envOf({{"DSEC_IMAGE", "a:1"}, {"DSEC_MEM", "lots"}}), PluginArgs{});
  ASSERT_ERROR(r, ErrorCode::kInvalidArgument);
  EXPECT_NE(r.error().message().find("DSEC_MEM=lots"), std::string::npos) << r.error().message();
}

TEST(Options, ValidateEachOption) {
  EXPECT_OK(validateOption(OptionId::kImage, "debian:12+python:3.11+ws-demo:1"));
  EXPECT_FALSE(validateOption(OptionId::kImage, "Debian:12").ok());
  EXPECT_FALSE(validateOption(OptionId::kImage, "debian").ok());
  EXPECT_FALSE(validateOption(OptionId::kImage, "a:1+a:2").ok());
  EXPECT_OK(validateOption(OptionId::kMem, "4G"));
  EXPECT_FALSE(validateOption(OptionId::kMem, "1M").ok());  // below the 4M minimum
  EXPECT_FALSE(validateOption(OptionId::kMem, "-1G").ok());
  EXPECT_OK(validateOption(OptionId::kWorkdir, "/work"));
  EXPECT_FALSE(validateOption(OptionId::kWorkdir, "work").ok());
  EXPECT_OK(validateOption(OptionId::kNet, "none"));
  EXPECT_OK(validateOption(OptionId::kNet, "host"));
  EXPECT_FALSE(validateOption(OptionId::kNet, "bridge").ok());
  EXPECT_OK(validateOption(OptionId::kBackend, "container"));
  EXPECT_FALSE(validateOption(OptionId::kBackend, "microvm").ok());
}

TEST(Options, TableCoversEveryOptionWithAnEnvironmentName) {
  const auto& table = optionTable();
  ASSERT_EQ(table.size(), static_cast<size_t>(OptionId::kCount));
  for (size_t i = 0; i < table.size(); ++i) {
    EXPECT_EQ(static_cast<size_t>(table[i].id), i);
    EXPECT_EQ(std::string(table[i].name).rfind("dsec-", 0), 0u);
    EXPECT_EQ(std::string(table[i].env).rfind("DSEC_", 0), 0u);
  }
}

TEST(SandboxId, NamesNodeJobAndStep) {
  EXPECT_EQ(sandboxIdFor({"n1", 42, 0}), "n1-42.0");
  EXPECT_EQ(sandboxIdFor({"n1", 42, kBatchStep}), "n1-42.batch");
  EXPECT_EQ(sandboxIdFor({"n1", 42, kInteractiveStep}), "n1-42.interactive");
  EXPECT_EQ(sandboxPrefixFor("n1", 42), "n1-42.");
  // Odd characters are replaced and long names cut: the id is also a hostname and a cgroup name.
  EXPECT_EQ(sandboxIdFor({"gpu:node", 1, 3}), "gpu_node-1.3");
  std::string longest = sandboxIdFor({std::string(200, 'x'), 4294967294u, kInteractiveStep});
  EXPECT_LE(longest.size(), 64u);
  EXPECT_EQ(sandboxIdFor({"", 1, 2}).rfind("n", 0), 0u);
}

}  // namespace
}  // namespace dsec::spank

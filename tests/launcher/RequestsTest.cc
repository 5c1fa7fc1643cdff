// Validation rules of the node API: every bad input is rejected with a message naming the field.
#include <gtest/gtest.h>

#include "dsec/launcher/api/Requests.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;
constexpr int64_t kNodeMemory = 8LL << 30;

Result<CreateParams> create(const std::string& body) {
  auto j = parseJsonObject(body);
  if (!j.ok()) return j.error();
  return parseCreateRequest(*j, kNodeMemory);
}

void expectInvalid(const std::string& body, const std::string& mention) {
  auto r = create(body);
  ASSERT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument) << r.error().toString();
  EXPECT_NE(r.error().message().find(mention), std::string::npos) << r.error().message();
}

TEST(CreateRequest, DefaultsFromImageOnly) {
  auto r = create(R"({"image": "debian:12+python:3.11"})");
  ASSERT_OK(r);
  EXPECT_EQ(r->image, "debian:12+python:3.11");
  ASSERT_EQ(r->layers.size(), 2u);
  EXPECT_EQ(r->layers[1].name, "python");
  EXPECT_EQ(r->backend, backends::BackendKind::kContainer);
  EXPECT_EQ(r->cpus, 1);
  EXPECT_EQ(r->memory_bytes, 512LL << 20);
  EXPECT_EQ(r->disk_bytes, 1LL << 30);
  EXPECT_EQ(r->pids, 1024);
  EXPECT_EQ(r->timeout, 0);
  EXPECT_EQ(r->network, backends::NetworkMode::kNone);
}

TEST(CreateRequest, AllFields) {
  auto r = create(R"({"image": "a:1", "backend": "container", "cpus": 0.5, "memory": "64M", "disk": 10485760,
      "pids": 64, "timeout": 3600, "idle_timeout": 1.5, "env": {"K": "V", "EMPTY": ""}, "labels": {"run": "42"},
      "network": "egress"})");
  ASSERT_OK(r);
  EXPECT_EQ(r->cpus, 0.5);
  EXPECT_EQ(r->memory_bytes, 64LL << 20);
  EXPECT_EQ(r->disk_bytes, 10485760);
  EXPECT_EQ(r->pids, 64);
  EXPECT_EQ(r->idle_timeout, 1.5);
  EXPECT_EQ(r->env.at("K"), "V");
  EXPECT_EQ(r->labels.at("run"), "42");
  EXPECT_EQ(r->network, backends::NetworkMode::kEgress);
}

TEST(CreateRequest, Qos) {
  auto r = create(R"({"image": "a:1"})");
  ASSERT_OK(r);
  EXPECT_EQ(r->qos, backends::CpuQos::kBatch);  // the default
  r = create(R"({"image": "a:1", "qos": "latency", "cpus": 2})");
  ASSERT_OK(r);
  EXPECT_EQ(r->qos, backends::CpuQos::kLatency);
  r = create(R"({"image": "a:1", "qos": "batch", "cpus": 0})");
  ASSERT_OK(r);
  EXPECT_EQ(r->qos, backends::CpuQos::kBatch);
  expectInvalid(R"({"image": "a:1", "qos": "realtime"})", "qos");
  expectInvalid(R"({"image": "a:1", "qos": 1})", "qos");
  expectInvalid(R"({"image": "a:1", "qos": null})", "qos");
  // A latency sandbox must say how many cores to dedicate.
  expectInvalid(R"({"image": "a:1", "qos": "latency", "cpus": 0})", "cpus > 0");
}

TEST(CreateRequest, RejectsBadInput) {
  expectInvalid(R"({})", "image");
  expectInvalid(R"({"image": 5})", "image");
  expectInvalid(R"({"image": "no version"})", "image");
  expectInvalid(R"({"image": "a:1+a:1"})", "image");
  expectInvalid(R"({"image": "a:1", "colour": "red"})", "unknown field 'colour'");
  expectInvalid(R"({"image": "a:1", "memory": -5})", "memory");
  expectInvalid(R"({"image": "a:1", "memory": "-5M"})", "memory");
  expectInvalid(R"({"image": "a:1", "memory": "1k"})", "at least 4M");
  expectInvalid(R"({"image": "a:1", "memory": "100T"})", "more than this node");
  expectInvalid(R"({"image": "a:1", "memory": 1e300})", "memory");
  expectInvalid(R"({"image": "a:1", "memory": 99999999999999999999999})", "memory");
  expectInvalid(R"({"image": "a:1", "memory": "lots"})", "memory");
  expectInvalid(R"({"image": "a:1", "memory": [1]})", "memory");
  expectInvalid(R"({"image": "a:1", "cpus": "two"})", "cpus");
  expectInvalid(R"({"image": "a:1", "cpus": -1})", "cpus");
  expectInvalid(R"({"image": "a:1", "cpus": 5000})", "cpus");
  expectInvalid(R"({"image": "a:1", "pids": 3})", "pids");
  expectInvalid(R"({"image": "a:1", "pids": 1.5})", "pids");
  expectInvalid(R"({"image": "a:1", "disk": "12"})", "disk");
  expectInvalid(R"({"image": "a:1", "timeout": -1})", "timeout");
  expectInvalid(R"({"image": "a:1", "idle_timeout": "soon"})", "idle_timeout");
  expectInvalid(R"({"image": "a:1", "timeout": 1e30})", "timeout");
  expectInvalid(R"({"image": "a:1", "env": {"A=B": "x"}})", "env");
  expectInvalid(R"({"image": "a:1", "env": {"A": 1}})", "env.A");
  expectInvalid(R"({"image": "a:1", "env": {"A": "x\u0000y"}})", "NUL");
  expectInvalid(R"({"image": "a:1", "env": ["A"]})", "env");
  expectInvalid(R"({"image": "a:1", "labels": {"k": 1}})", "labels.k");
  expectInvalid(R"({"image": "a:1", "labels": {"a=b": "c"}})", "labels");
  expectInvalid(R"({"image": "a:1", "network": "bridge"})", "network");
  // No sandbox shares the node's network.
  expectInvalid(R"({"image": "a:1", "network": "host"})", "network");
  expectInvalid(R"({"image": "a:1", "backend": "docker"})", "backend");
  expectInvalid(R"([1, 2])", "JSON object");
  expectInvalid(R"({"image": )", "malformed JSON");
  expectInvalid(std::string(1000, '[') + std::string(1000, ']'), "nested");
}

TEST(CreateRequest, ZeroMeansNoLimit) {
  auto r = create(R"({"image": "a:1", "memory": 0, "cpus": 0, "pids": 0, "disk": 0})");
  ASSERT_OK(r);
  EXPECT_EQ(r->memory_bytes, 0);
  EXPECT_EQ(r->pids, 0);
}

TEST(CreateRequest, MachineBackendsParseAndFncallIsNotASandboxBackend) {
  auto micro = create(R"({"image": "a:1", "backend": "microvm"})");
  ASSERT_OK(micro);
  EXPECT_EQ(micro->backend, backends::BackendKind::kMicrovm);
  auto full = create(R"({"image": "a:1", "backend": "vm"})");
  ASSERT_OK(full);
  EXPECT_EQ(full->backend, backends::BackendKind::kVm);
  auto r = create(R"({"image": "a:1", "backend": "fncall"})");
  ASSERT_ERROR(r, ErrorCode::kInvalidArgument);
  EXPECT_NE(r.error().message().find("POST /v1/call"), std::string::npos);
  ASSERT_ERROR(create(R"({"image": "a:1", "backend": "lxc"})"), ErrorCode::kInvalidArgument);
}

TEST(ExecRequest, StringRunsUnderShell) {
  auto r = parseExecRequest(json{{"cmd", "echo hi"}});
  ASSERT_OK(r);
  EXPECT_EQ(r->argv, (std::vector<std::string>{"/bin/sh", "-c", "echo hi"}));
  EXPECT_EQ(r->output_cap, kDefaultOutputCap);
  EXPECT_EQ(r->cwd, "/");
}

TEST(ExecRequest, AllFields) {
  auto r = parseExecRequest(json{{"cmd", {"cat", "-"}},
                                 {"timeout", 2.5},
                                 {"cwd", "/tmp"},
                                 {"env", {{"A", "1"}}},
                                 {"stdin_b64", "aGVsbG8="},
                                 {"output_cap", 100}});
  ASSERT_OK(r);
  EXPECT_EQ(r->argv, (std::vector<std::string>{"cat", "-"}));
  EXPECT_EQ(r->timeout_seconds, 2.5);
  EXPECT_EQ(r->cwd, "/tmp");
  EXPECT_EQ(r->stdin_data, "hello");
  EXPECT_EQ(r->output_cap, 100);
}

TEST(ExecRequest, RejectsBadInput) {
  for (const auto& [body, mention] : std::vector<std::pair<json, std::string>>{
           {json::object(), "cmd"},
           {json{{"cmd", ""}}, "cmd"},
           {json{{"cmd", json::array()}}, "cmd"},
           {json{{"cmd", {"ls", 3}}}, "cmd[1]"},
           {json{{"cmd", 7}}, "cmd"},
           {json{{"cmd", "ls"}, {"timeout", -1}}, "timeout"},
           {json{{"cmd", "ls"}, {"cwd", "relative"}}, "cwd"},
           {json{{"cmd", "ls"}, {"stdin", "a"}, {"stdin_b64", "YQ=="}}, "exclusive"},
           {json{{"cmd", "ls"}, {"stdin_b64", "!!!"}}, "stdin_b64"},
           {json{{"cmd", "ls"}, {"output_cap", -1}}, "output_cap"},
           {json{{"cmd", "ls"}, {"output_cap", 1LL << 40}}, "output_cap"},
           {json{{"cmd", "ls"}, {"shell", true}}, "unknown field 'shell'"},
       }) {
    auto r = parseExecRequest(body);
    ASSERT_FALSE(r.ok()) << body.dump();
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message().find(mention), std::string::npos) << body.dump() << ": " << r.error().message();
  }
}

TEST(Paths, Validation) {
  EXPECT_OK(validateSandboxPath("/etc/hostname"));
  ASSERT_ERROR(validateSandboxPath(""), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(validateSandboxPath("etc/hostname"), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(validateSandboxPath(std::string("/a\0b", 4)), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(validateSandboxPath("/" + std::string(5000, 'a')), ErrorCode::kInvalidArgument);
}

TEST(Misc, FileModeLabelsBase64Compare) {
  EXPECT_EQ(*parseFileMode("0644"), 0644u);
  EXPECT_EQ(*parseFileMode("755"), 0755u);
  ASSERT_ERROR(parseFileMode("0999"), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(parseFileMode("rw"), ErrorCode::kInvalidArgument);
  auto sel = parseLabelSelectors({"a=1", "b=x=y"});
  ASSERT_OK(sel);
  EXPECT_EQ(sel->at("b"), "x=y");
  ASSERT_ERROR(parseLabelSelectors({"novalue"}), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(labelsMatch({{"a", "1"}, {"b", "2"}}, {{"a", "1"}}));
  EXPECT_FALSE(labelsMatch({{"a", "1"}}, {{"a", "1"}, {"b", "2"}}));
  EXPECT_TRUE(constantTimeEquals("abc", "abc"));
  EXPECT_FALSE(constantTimeEquals("abc", "abd"));
  EXPECT_FALSE(constantTimeEquals("abc", "abcd"));
  EXPECT_TRUE(bearerTokenMatches("Bearer tok", "tok"));
  EXPECT_TRUE(bearerTokenMatches("bearer  tok ", "tok"));
  EXPECT_TRUE(bearerTokenMatches("BEARER tok", "tok"));
  EXPECT_FALSE(bearerTokenMatches("Bearer tok2", "tok"));
  EXPECT_FALSE(bearerTokenMatches("Basic tok", "tok"));
  EXPECT_FALSE(bearerTokenMatches("Bearertok", "tok"));
  EXPECT_FALSE(bearerTokenMatches("Bearer ", ""));
  EXPECT_FALSE(bearerTokenMatches("tok", "tok"));
}

}  // namespace
}  // namespace dsec::launcher

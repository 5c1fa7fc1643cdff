// POST /run_code's wire format: SandboxFusion's request parsed (defaults, every field, a clear error naming the
// field for each kind of bad input) and its response shaped (status as SandboxFusion's parse_run_status decides,
// nulls where it has them); and the fetch driver's trailer.
#include <gtest/gtest.h>

#include "dsec/common/Base64.h"
#include "dsec/launcher/api/Requests.h"
#include "dsec/launcher/api/RunCodeRequests.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::launcher {
namespace {

using nlohmann::json;
constexpr int64_t kNodeMemory = 8LL << 30;

Result<RunCodeRequest> parse(const std::string& body, int64_t node_memory = kNodeMemory) {
  auto j = parseJsonObject(body);
  if (!j.ok()) return j.error();
  return parseRunCodeRequest(*j, node_memory);
}

void expectInvalid(const std::string& body, const std::string& mention) {
  auto r = parse(body);
  ASSERT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument) << r.error().toString();
  EXPECT_NE(r.error().message().find(mention), std::string::npos) << body << " -> " << r.error().message();
}

TEST(RunCodeRequest, VerlsBodyTakesTheDefaults) {
  // What verl's sandbox_fusion reward code sends.
  auto r = parse(R"j({"compile_timeout": 10, "run_timeout": 10, "code": "print(1)", "stdin": "",
                      "language": "python", "files": {}, "fetch_files": []})j");
  ASSERT_OK(r);
  EXPECT_EQ(r->language, RunLanguage::kPython);
  EXPECT_EQ(r->code, "print(1)");
  EXPECT_EQ(r->stdin_data, "");
  EXPECT_DOUBLE_EQ(r->compile_timeout, 10);
  EXPECT_DOUBLE_EQ(r->run_timeout, 10);
  EXPECT_EQ(r->memory_bytes, kDefaultRunCodeMemoryMB << 20);
  EXPECT_TRUE(r->files.empty());
  EXPECT_TRUE(r->fetch_files.empty());
}

TEST(RunCodeRequest, EveryField) {
  auto r = parse(R"j({"code": "int main(){}", "language": "cpp", "compile_timeout": 20.5, "run_timeout": 1.5,
                      "memory_limit_MB": 256, "stdin": "1 2\n", "files": {"data/in.txt": "aGk=", "skip": null},
                      "fetch_files": ["out.txt", "out.txt", "d/e.bin"]})j");
  ASSERT_OK(r);
  EXPECT_EQ(r->language, RunLanguage::kCpp);
  EXPECT_DOUBLE_EQ(r->compile_timeout, 20.5);
  EXPECT_DOUBLE_EQ(r->run_timeout, 1.5);
  EXPECT_EQ(r->memory_bytes, 256LL << 20);
  EXPECT_EQ(r->stdin_data, "1 2\n");
  ASSERT_EQ(r->files.size(), 1u);  // a null file is skipped, as SandboxFusion does
  EXPECT_EQ(r->files.at("data/in.txt"), "hi");
  EXPECT_EQ(r->fetch_files, (std::vector<std::string>{"out.txt", "d/e.bin"}));
  // -1 is SandboxFusion's "no limit": the default limit, never none.
  auto d = parse(R"j({"code": "echo", "language": "bash", "memory_limit_MB": -1, "stdin": null})j");
  ASSERT_OK(d);
  EXPECT_EQ(d->language, RunLanguage::kBash);
  EXPECT_EQ(d->memory_bytes, kDefaultRunCodeMemoryMB << 20);
}

TEST(RunCodeRequest, BadInputNamesTheField) {
  expectInvalid(R"j({"language": "python"})j", "code");
  expectInvalid(R"j({"code": "x"})j", "language");
  expectInvalid(R"j({"code": "x", "language": "go"})j", "unsupported language \"go\"");
  expectInvalid(R"j({"code": "x", "language": 3})j", "language");
  expectInvalid(R"j({"code": "x", "language": "python", "extra": 1})j", "unknown field 'extra'");
  expectInvalid(R"j({"code": "x", "language": "python", "run_timeout": 0})j", "run_timeout");
  expectInvalid(R"j({"code": "x", "language": "python", "run_timeout": -3})j", "run_timeout");
  expectInvalid(R"j({"code": "x", "language": "python", "run_timeout": 601})j", "at most 600");
  expectInvalid(R"j({"code": "x", "language": "python", "compile_timeout": "10"})j", "compile_timeout");
  expectInvalid(R"j({"code": "x", "language": "python", "memory_limit_MB": 0})j", "memory_limit_MB");
  expectInvalid(R"j({"code": "x", "language": "python", "memory_limit_MB": 16})j", "at least 32");
  expectInvalid(R"j({"code": "x", "language": "python", "memory_limit_MB": 64.5})j", "memory_limit_MB");
  expectInvalid(R"j({"code": "x", "language": "python", "memory_limit_MB": 9999999})j", "memory_limit_MB");
  expectInvalid(R"j({"code": "x", "language": "python", "stdin": 5})j", "stdin");
  expectInvalid(R"j({"code": "x", "language": "python", "files": {"a": "!!notbase64"}})j", "not base64");
  expectInvalid(R"j({"code": "x", "language": "python", "files": {"/etc/passwd": "aGk="}})j", "not absolute");
  expectInvalid(R"j({"code": "x", "language": "python", "files": {"../x": "aGk="}})j", "'..'");
  expectInvalid(R"j({"code": "x", "language": "python", "files": {"a/./b": "aGk="}})j", "'.'");
  expectInvalid(R"j({"code": "x", "language": "python", "files": {"a": "aGk=", "a/b": "aGk="}})j", "directory");
  expectInvalid(R"j({"code": "x", "language": "python", "files": []})j", "files");
  expectInvalid(R"j({"code": "x", "language": "python", "fetch_files": "out.txt"})j", "fetch_files");
  expectInvalid(R"j({"code": "x", "language": "python", "fetch_files": ["/etc/shadow"]})j", "fetch_files[0]");
  expectInvalid(R"j({"code": "x", "language": "python", "fetch_files": ["ok", "a/../../b"]})j", "fetch_files[1]");
  // More memory than the node has is refused, not cut down.
  auto r = parse(R"j({"code": "x", "language": "python", "memory_limit_MB": 4096})j", 1LL << 30);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("node's memory"), std::string::npos) << r.error().message();
}

CommandOutcome finished(int rc, std::string out = "", std::string err = "") {
  CommandOutcome o;
  o.status = CommandStatus::kFinished;
  o.execution_time = 0.25;
  o.return_code = rc;
  o.stdout_data = std::move(out);
  o.stderr_data = std::move(err);
  return o;
}

TEST(RunCodeResponse, SuccessHasSandboxFusionsFields) {
  RunCodeResult r;
  r.run = finished(0, "hi\n");
  r.files["out.bin"] = std::string("\x00\xff", 2);
  json j = runCodeResponseJson(r, "n0");
  EXPECT_EQ(j["status"], "Success");
  EXPECT_EQ(j["message"], "");
  EXPECT_TRUE(j["compile_result"].is_null());
  EXPECT_EQ(
      j["run_result"],
      (json{{"status", "Finished"}, {"execution_time", 0.25}, {"return_code", 0}, {"stdout", "hi\n"}, {"stderr", ""}}));
  EXPECT_EQ(j["executor_pod_name"], "n0");
  EXPECT_EQ(j["files"], (json{{"out.bin", base64Encode(std::string("\x00\xff", 2))}}));
}

TEST(RunCodeResponse, NonZeroTimeLimitAndCompileErrorAreFailed) {
  RunCodeResult nonzero;
  nonzero.run = finished(3);
  EXPECT_EQ(runCodeResponseJson(nonzero, "n0")["status"], "Failed");

  RunCodeResult signalled;
  signalled.run = finished(-9);
  EXPECT_EQ(runCodeResponseJson(signalled, "n0")["run_result"]["return_code"], -9);

  RunCodeResult tle;
  CommandOutcome o;
  o.status = CommandStatus::kTimeLimitExceeded;
  o.execution_time = 1.0;
  tle.run = o;
  json t = runCodeResponseJson(tle, "n0");
  EXPECT_EQ(t["status"], "Failed");
  EXPECT_EQ(t["message"], "");
  EXPECT_EQ(t["run_result"]["status"], "TimeLimitExceeded");
  EXPECT_TRUE(t["run_result"]["return_code"].is_null());

  RunCodeResult compile_error;
  compile_error.compile = finished(1, "", "main.cpp:1: error: expected ';'");
  json c = runCodeResponseJson(compile_error, "n0");
  EXPECT_EQ(c["status"], "Failed");
  EXPECT_EQ(c["compile_result"]["return_code"], 1);
  EXPECT_TRUE(c["run_result"].is_null());
  EXPECT_EQ(c["files"], json::object());
}

TEST(RunCodeResponse, AnErrorOutcomeIsASandboxErrorWithItsMessage) {
  RunCodeResult r;
  r.compile = finished(0);
  CommandOutcome e;
  e.status = CommandStatus::kError;
  e.stderr_data = "exec failed: the sandbox is gone";
  r.run = e;
  json j = runCodeResponseJson(r, "n0");
  EXPECT_EQ(j["status"], "SandboxError");
  EXPECT_EQ(j["message"], "exec failed: the sandbox is gone");
  EXPECT_EQ(j["run_result"]["status"], "Error");
  EXPECT_TRUE(j["run_result"]["execution_time"].is_null());
  EXPECT_TRUE(j["run_result"]["return_code"].is_null());
}

TEST(RunCodeResponse, ErrorsHaveBothShapes) {
  json j = runCodeErrorJson("invalid_request", "field 'language': unsupported language \"go\"");
  EXPECT_EQ(j["status"], "SandboxError");
  EXPECT_EQ(j["message"], "field 'language': unsupported language \"go\"");
  EXPECT_TRUE(j["run_result"].is_null());
  EXPECT_TRUE(j["compile_result"].is_null());
  EXPECT_EQ(j["files"], json::object());
  EXPECT_EQ(j["error"]["code"], "invalid_request");
  EXPECT_EQ(j["error"]["message"], j["message"]);
}

std::string trailer(const std::string& nonce, const json& report) {
  return "\x1e"
         "dsec-run-code-begin-" +
         nonce + report.dump() +
         "\x1e"
         "dsec-run-code-end-" +
         nonce;
}

TEST(FetchTrailer, SplitsTheProgramsOutputFromTheReport) {
  const std::string nonce = "0123abcd";
  json report{
      {"rc", 2}, {"tle", false}, {"time", 0.5}, {"files", {{"out.txt", base64Encode("result")}}}, {"error", ""}};
  FetchTrailer t = parseFetchTrailer("line 1\nno newline" + trailer(nonce, report) + "late", nonce);
  ASSERT_TRUE(t.found);
  EXPECT_EQ(t.error, "");
  EXPECT_EQ(t.program_stdout, "line 1\nno newlinelate");
  EXPECT_EQ(t.return_code, 2);
  EXPECT_FALSE(t.time_limit_exceeded);
  EXPECT_DOUBLE_EQ(t.execution_time, 0.5);
  EXPECT_EQ(t.files.at("out.txt"), "result");
}

TEST(FetchTrailer, AMarkerOfAnotherNonceIsTheProgramsOutput) {
  json report{{"rc", 0}, {"tle", false}, {"time", 0.1}, {"files", json::object()}, {"error", ""}};
  FetchTrailer t = parseFetchTrailer(trailer("ffff", report), "0000");
  EXPECT_FALSE(t.found);
  FetchTrailer cut = parseFetchTrailer(
      "\x1e"
      "dsec-run-code-begin-0000{\"rc\":",
      "0000");
  EXPECT_FALSE(cut.found);
}

TEST(FetchTrailer, ATimeLimitHasNoReturnCodeAndABadReportIsAnError) {
  json tle{{"rc", nullptr}, {"tle", true}, {"time", 2.0}, {"files", json::object()}, {"error", ""}};
  FetchTrailer t = parseFetchTrailer(trailer("aa", tle), "aa");
  ASSERT_TRUE(t.found);
  EXPECT_TRUE(t.time_limit_exceeded);
  EXPECT_FALSE(t.return_code.has_value());
  json big{{"rc", 0}, {"tle", false}, {"time", 2.0}, {"files", json::object()}, {"error", "more than 16 bytes"}};
  EXPECT_EQ(parseFetchTrailer(trailer("aa", big), "aa").error, "more than 16 bytes");
  json bad{{"rc", 0}, {"files", {{"x", "!!"}}}};
  EXPECT_NE(parseFetchTrailer(trailer("aa", bad), "aa").error, "");
}

TEST(FetchTrailer, TheDriverCarriesTheNonce) {
  std::string src = fetchDriverSource("c0ffee");
  EXPECT_NE(src.find("N = 'c0ffee'"), std::string::npos);
  EXPECT_NE(src.find("dsec-run-code-begin-"), std::string::npos);
}

}  // namespace
}  // namespace dsec::launcher

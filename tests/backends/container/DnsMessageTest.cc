// The DNS parser of the node's resolver faces sandboxes' queries and the network's answers: malformed, cut short,
// looping compression, huge counts and odd bytes are refused (never read past the message, never loop), and the
// addresses of an answer are exactly the question's own and those at the end of its CNAME chain.
#include <gtest/gtest.h>

#include <random>

#include "DnsMessage.h"
#include "dsec/backends/NetworkPolicy.h"

namespace dsec::backends::dns {
namespace {

std::vector<uint8_t> header(uint16_t id, uint16_t flags, uint16_t qd, uint16_t an, uint16_t ns = 0, uint16_t ar = 0) {
  std::vector<uint8_t> m;
  for (uint16_t v : {id, flags, qd, an, ns, ar}) appendU16(m, v);
  return m;
}

std::vector<uint8_t> ip(uint8_t a, uint8_t b, uint8_t c, uint8_t d) { return {a, b, c, d}; }

// An answer to `name` (type A) with the given answer records already encoded.
std::vector<uint8_t> answer(uint16_t id, const std::string& name, uint16_t count, const std::vector<uint8_t>& rrs) {
  auto m = header(id, 0x8180, 1, count);
  appendName(m, name);
  appendU16(m, kTypeA);
  appendU16(m, kClassIn);
  m.insert(m.end(), rrs.begin(), rrs.end());
  return m;
}

TEST(DnsMessageTest, AQueryIsParsedToItsLowerCaseName) {
  auto q = buildQuery(0x1234, "PyPI.Org", kTypeA);
  auto parsed = parseQuery(q);
  ASSERT_TRUE(parsed.ok()) << parsed.error().toString();
  EXPECT_EQ(parsed->name, "pypi.org");
  EXPECT_EQ(parsed->type, kTypeA);
  EXPECT_EQ(parsed->klass, kClassIn);
  EXPECT_EQ(parsed->end, q.size());
  EXPECT_EQ(messageId(q), 0x1234);
}

TEST(DnsMessageTest, ARootQueryIsADot) {
  auto parsed = parseQuery(buildQuery(1, ".", kTypeA));
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->name, ".");
}

TEST(DnsMessageTest, OddBytesInALabelAreEscapedSoTheyNeverMatchAPolicyName) {
  // One label "a.pypi" then "org": not the name a.pypi.org, whatever the text looks like.
  std::vector<uint8_t> q = header(1, 0x0100, 1, 0);
  q.push_back(6);
  for (char c : std::string("a.pypi")) q.push_back(static_cast<uint8_t>(c));
  q.push_back(3);
  for (char c : std::string("org")) q.push_back(static_cast<uint8_t>(c));
  q.push_back(0);
  appendU16(q, kTypeA);
  appendU16(q, kClassIn);
  auto parsed = parseQuery(q);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->name, "a\\046pypi.org");
  auto rule = parseEgressRule("a.pypi.org");
  ASSERT_TRUE(rule.ok());
  EXPECT_FALSE(rule->matchesName(parsed->name));
}

TEST(DnsMessageTest, NonQueriesAndOddCountsAreRefused) {
  auto q = buildQuery(1, "x.test", kTypeA);
  auto response = q;
  response[2] |= 0x80;  // QR
  EXPECT_FALSE(parseQuery(response).ok());
  auto notify = q;
  notify[2] |= 0x20;  // opcode 4
  EXPECT_FALSE(parseQuery(notify).ok());
  auto two = q;
  two[5] = 2;  // QDCOUNT 2
  EXPECT_FALSE(parseQuery(two).ok());
  auto none = q;
  none[5] = 0;
  EXPECT_FALSE(parseQuery(none).ok());
  auto answers = q;
  answers[7] = 1;  // ANCOUNT
  EXPECT_FALSE(parseQuery(answers).ok());
  auto huge = q;
  huge[4] = huge[5] = 0xff;
  EXPECT_FALSE(parseQuery(huge).ok());
}

TEST(DnsMessageTest, EveryTruncationOfAQueryIsRefused) {
  auto q = buildQuery(7, "files.pythonhosted.org", kTypeA);
  for (size_t len = 0; len < q.size(); ++len) {
    EXPECT_FALSE(parseQuery(Bytes(q.data(), len)).ok()) << "length " << len;
  }
}

TEST(DnsMessageTest, CompressionLoopsAndForwardPointersAreRefused) {
  // A pointer to itself.
  auto self = header(1, 0, 1, 0);
  self.push_back(0xC0);
  self.push_back(12);
  appendU16(self, kTypeA);
  appendU16(self, kClassIn);
  EXPECT_FALSE(parseQuery(self).ok());
  // A label then a pointer back to it: each jump is backwards, the walk would never end.
  auto loop = header(1, 0, 1, 0);
  loop.push_back(1);
  loop.push_back('a');
  loop.push_back(0xC0);
  loop.push_back(12);
  appendU16(loop, kTypeA);
  appendU16(loop, kClassIn);
  EXPECT_FALSE(parseQuery(loop).ok());
  // A pointer forward, past the end.
  auto forward = header(1, 0, 1, 0);
  forward.push_back(0xC0);
  forward.push_back(0xff);
  EXPECT_FALSE(parseQuery(forward).ok());
  // Reserved label types (0x40, 0x80).
  auto reserved = header(1, 0, 1, 0);
  reserved.push_back(0x41);
  reserved.push_back(0);
  appendU16(reserved, kTypeA);
  appendU16(reserved, kClassIn);
  EXPECT_FALSE(parseQuery(reserved).ok());
}

TEST(DnsMessageTest, NamesLongerThan255BytesAreRefused) {
  std::string name;
  for (int i = 0; i < 5; ++i) name += std::string(60, 'a') + ".";
  name += "test";  // 5*61 + 5 > 255
  EXPECT_FALSE(parseQuery(buildQuery(1, name, kTypeA)).ok());
  std::string fits;
  for (int i = 0; i < 3; ++i) fits += std::string(63, 'b') + ".";
  fits += std::string(61, 'c');  // 3*64 + 62 + 1 = 255
  auto parsed = parseQuery(buildQuery(1, fits, kTypeA));
  ASSERT_TRUE(parsed.ok()) << parsed.error().toString();
  EXPECT_EQ(parsed->name, fits);
}

TEST(DnsMessageTest, TheAddressesOfAnAnswerFollowItsCnameChainOnly) {
  std::vector<uint8_t> rrs;
  std::vector<uint8_t> target;
  appendName(target, "mid.test");
  appendRecord(rrs, "Start.test", kTypeCname, 300, target);
  target.clear();
  appendName(target, "end.test");
  appendRecord(rrs, "mid.test", kTypeCname, 300, target);
  appendRecord(rrs, "end.test", kTypeA, 60, ip(192, 0, 2, 7));
  appendRecord(rrs, "unrelated.test", kTypeA, 60, ip(192, 0, 2, 66));  // not on the chain: never opened
  auto m = answer(9, "start.test", 4, rrs);
  auto a = answerAddresses(m, "start.test");
  ASSERT_TRUE(a.ok()) << a.error().toString();
  ASSERT_EQ(a->size(), 1u);
  EXPECT_EQ((*a)[0].ip4, 0xC0000207u);
  EXPECT_EQ((*a)[0].ttl, 60u);
}

TEST(DnsMessageTest, AChainInAnyOrderAndACnameLoopEnd) {
  std::vector<uint8_t> rrs;
  appendRecord(rrs, "end.test", kTypeA, 5, ip(192, 0, 2, 8));
  std::vector<uint8_t> t;
  appendName(t, "end.test");
  appendRecord(rrs, "start.test", kTypeCname, 300, t);
  t.clear();
  appendName(t, "start.test");
  appendRecord(rrs, "end.test", kTypeCname, 300, t);  // a loop back
  auto a = answerAddresses(answer(1, "start.test", 3, rrs), "start.test");
  ASSERT_TRUE(a.ok()) << a.error().toString();
  ASSERT_EQ(a->size(), 1u);
  EXPECT_EQ((*a)[0].ip4, 0xC0000208u);
}

TEST(DnsMessageTest, CompressedAnswersAreRead) {
  // The answer's owner is a pointer to the question's name, its CNAME target a pointer into it.
  auto m = header(3, 0x8180, 1, 2);
  appendName(m, "www.example.test");  // at 12
  appendU16(m, kTypeA);
  appendU16(m, kClassIn);
  m.push_back(0xC0);
  m.push_back(12);
  appendU16(m, kTypeCname);
  appendU16(m, kClassIn);
  appendU32(m, 100);
  appendU16(m, 2);
  m.push_back(0xC0);
  m.push_back(16);  // "example.test"
  m.push_back(0xC0);
  m.push_back(16);
  appendU16(m, kTypeA);
  appendU16(m, kClassIn);
  appendU32(m, 100);
  appendU16(m, 4);
  for (uint8_t b : ip(198, 51, 100, 1)) m.push_back(b);
  auto a = answerAddresses(m, "www.example.test");
  ASSERT_TRUE(a.ok()) << a.error().toString();
  ASSERT_EQ(a->size(), 1u);
  EXPECT_EQ((*a)[0].ip4, 0xC6336401u);
}

TEST(DnsMessageTest, AnswersThatLieAboutTheirSizeAreRefused) {
  std::vector<uint8_t> rrs;
  appendRecord(rrs, "x.test", kTypeA, 60, ip(192, 0, 2, 1));
  auto m = answer(1, "x.test", 1, rrs);
  for (size_t len = 0; len < m.size(); ++len) {
    auto cut = answerAddresses(Bytes(m.data(), len), "x.test");
    EXPECT_FALSE(cut.ok()) << "length " << len;
  }
  auto many = answer(1, "x.test", 0xffff, rrs);  // 65535 records claimed, one there
  EXPECT_FALSE(answerAddresses(many, "x.test").ok());
  // An A record whose data is not 4 bytes is no address.
  std::vector<uint8_t> odd;
  appendRecord(odd, "x.test", kTypeA, 60, {1, 2, 3});
  auto a = answerAddresses(answer(1, "x.test", 1, odd), "x.test");
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->empty());
}

TEST(DnsMessageTest, AnAnswerMustBeToTheQuestionSent) {
  auto q = buildQuery(0x4242, "a.test", kTypeA);
  auto sent = parseQuery(q);
  ASSERT_TRUE(sent.ok());
  auto good = answer(0x4242, "A.test", 0, {});
  auto rcode = checkAnswer(good, 0x4242, *sent);
  ASSERT_TRUE(rcode.ok()) << rcode.error().toString();
  EXPECT_EQ(*rcode, kNoError);
  EXPECT_FALSE(checkAnswer(good, 0x4243, *sent).ok()) << "another ID";
  EXPECT_FALSE(checkAnswer(answer(0x4242, "b.test", 0, {}), 0x4242, *sent).ok()) << "another name";
  EXPECT_FALSE(checkAnswer(q, 0x4242, *sent).ok()) << "the query itself is no answer";
}

TEST(DnsMessageTest, RepliesKeepIdRdAndQuestion) {
  auto q = buildQuery(0xBEEF, "denied.test", kTypeA);
  auto parsed = parseQuery(q);
  ASSERT_TRUE(parsed.ok());
  auto r = replyTo(q, *parsed, kRefused);
  EXPECT_EQ(messageId(r), 0xBEEF);
  EXPECT_EQ(r[2], 0x81);  // QR, RD
  EXPECT_EQ(r[3] & 0x0F, kRefused);
  EXPECT_EQ(r[5], 1);  // one question
  EXPECT_EQ(std::vector<uint8_t>(r.begin() + kHeaderSize, r.end()),
            std::vector<uint8_t>(q.begin() + kHeaderSize, q.end()));
  auto h = headerReply(q, kFormErr);
  EXPECT_EQ(h.size(), kHeaderSize);
  EXPECT_EQ(h[3] & 0x0F, kFormErr);
}

TEST(DnsMessageTest, RandomBytesNeverCrashOrReadOutside) {
  // Fuzz-ish: random messages and random mutations of valid ones (run under ASan in the sanitizer build).
  std::mt19937 rng(12345);
  std::vector<uint8_t> rrs;
  std::vector<uint8_t> t;
  appendName(t, "b.test");
  appendRecord(rrs, "a.test", kTypeCname, 1, t);
  appendRecord(rrs, "b.test", kTypeA, 1, ip(1, 2, 3, 4));
  const auto base = answer(5, "a.test", 2, rrs);
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> m;
    if (i % 2 == 0) {
      m.resize(rng() % 80);
      for (auto& b : m) b = static_cast<uint8_t>(rng());
    } else {
      m = base;
      for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) m[rng() % m.size()] = static_cast<uint8_t>(rng());
      m.resize(rng() % (m.size() + 1));
    }
    (void)parseQuery(m);
    auto a = answerAddresses(m, "a.test");
    if (a.ok()) {
      EXPECT_LE(a->size(), 2u);
    }
  }
  // The unmutated answer still reads (the loop above tested the parser, not a broken fixture).
  auto whole = answerAddresses(base, "a.test");
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->size(), 1u);
}

TEST(DnsMessageTest, PolicyNamesMatchExactlyOrStrictlyBelowAWildcard) {
  auto exact = parseEgressRule("pypi.org:443");
  auto wild = parseEgressRule("*.pythonhosted.org");
  ASSERT_TRUE(exact.ok() && wild.ok());
  EXPECT_TRUE(exact->matchesName("pypi.org"));
  EXPECT_FALSE(exact->matchesName("www.pypi.org"));
  EXPECT_FALSE(exact->matchesName("evilpypi.org"));
  EXPECT_TRUE(wild->matchesName("files.pythonhosted.org"));
  EXPECT_TRUE(wild->matchesName("a.b.pythonhosted.org"));
  EXPECT_FALSE(wild->matchesName("pythonhosted.org"));
  EXPECT_FALSE(wild->matchesName("evilpythonhosted.org"));
  auto policy = parseEgressPolicy({"pypi.org", "10.0.0.0/8"});
  ASSERT_TRUE(policy.ok());
  EXPECT_EQ(policy->verdictFor("pypi.org"), NameVerdict::kAllowed);
  EXPECT_EQ(policy->verdictFor("other.org"), NameVerdict::kDenied);
  auto broad = parseEgressPolicy({"0.0.0.0/0"});
  ASSERT_TRUE(broad.ok());
  EXPECT_EQ(broad->verdictFor("other.org"), NameVerdict::kAnyAddress);
  EXPECT_EQ(EgressPolicy{}.verdictFor("pypi.org"), NameVerdict::kDenied);
}

}  // namespace
}  // namespace dsec::backends::dns

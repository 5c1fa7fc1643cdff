#include <gtest/gtest.h>

#include "dsec/placement/CpuList.h"
#include "dsec/placement/NodeModel.h"
#include "dsec/testing/TestSupport.h"

namespace dsec::placement {
namespace {

constexpr int64_t kGiB = 1LL << 30;

TEST(CpuList, FormatsAndParsesSlurmStyleLists) {
  EXPECT_EQ(formatCpuList({}), "");
  EXPECT_EQ(formatCpuList({3}), "3");
  EXPECT_EQ(formatCpuList({96, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 97, 98, 5}), "0-11,96-98");
  EXPECT_EQ(formatCpuList({1, 3, 4, 6}), "1,3-4,6");
  auto ids = parseCpuList("0-3,8,10-11\n");
  ASSERT_OK(ids);
  EXPECT_EQ(*ids, (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_TRUE(parseCpuList("")->empty());
  ASSERT_ERROR(parseCpuList("3-1"), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(parseCpuList("a"), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(parseCpuList("1,,2"), ErrorCode::kInvalidArgument);
  ASSERT_ERROR(parseCpuList("-1"), ErrorCode::kInvalidArgument);
  EXPECT_NE(parseCpuList("1-x").error().message().find("1-x"), std::string::npos);
}

TEST(NodeModel, TwoSocketNodeFromSyntheticDescription) {
  auto model = NodeModel::fromSynthetic("pack:2 [numa(memory=384GiB)] l3:12 core:8 pu:1");
  ASSERT_OK(model);
  NodeSummary s = model->summary();
  EXPECT_EQ(s.packages, 2);
  EXPECT_EQ(s.numa_domains, 2);
  EXPECT_EQ(s.l3_groups, 24);
  EXPECT_EQ(s.cores, 192);
  EXPECT_EQ(s.pus, 192);
  EXPECT_EQ(s.memory_bytes, 768 * kGiB);
  ASSERT_EQ(model->numaDomains().size(), 2u);
  for (int n = 0; n < 2; ++n) {
    const NumaDomain& d = model->numaDomains()[n];
    EXPECT_EQ(d.memory_bytes, 384 * kGiB);
    EXPECT_EQ(d.package, n);
    EXPECT_EQ(d.cores.size(), 96u);
    EXPECT_EQ(d.l3_groups.size(), 12u);
    EXPECT_EQ(model->packages()[n].numa, std::vector<int>{n});
  }
  EXPECT_EQ(model->numaDomains()[0].cpuset, "0-95");
  EXPECT_EQ(model->numaDomains()[1].cpuset, "96-191");
  EXPECT_EQ(model->cpusetAll(), "0-191");
  // Every L3 group holds 8 cores of one domain.
  for (const auto& g : model->l3Groups()) {
    EXPECT_EQ(g.cores.size(), 8u);
    for (int c : g.cores) EXPECT_EQ(model->cores()[c].numa, g.numa);
  }
  EXPECT_EQ(model->cpusetOfCores({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 96, 97}), "0-11,96-97");
  EXPECT_EQ(model->memsOf({0, 1}), "0-1");
}

TEST(NodeModel, SmtNodeHasTwoPusPerCore) {
  auto model = NodeModel::fromSynthetic("pack:2 [numa] l3:12 core:8 pu:2");
  ASSERT_OK(model);
  NodeSummary s = model->summary();
  EXPECT_EQ(s.packages, 2);
  EXPECT_EQ(s.numa_domains, 2);
  EXPECT_EQ(s.l3_groups, 24);
  EXPECT_EQ(s.cores, 192);
  EXPECT_EQ(s.pus, 384);
  // A synthetic "[numa]" says nothing about memory.
  EXPECT_EQ(s.memory_bytes, 0);
  EXPECT_EQ(model->cores()[0].pus, (std::vector<int>{0, 1}));
  EXPECT_EQ(model->cores()[191].pus, (std::vector<int>{382, 383}));
  EXPECT_EQ(model->numaDomains()[1].cpuset, "192-383");
  EXPECT_EQ(model->cpusetOfCores({0, 2}), "0-1,4-5");
}

TEST(NodeModel, Nps4NodeHasEightNumaDomains) {
  auto model = NodeModel::fromSynthetic("pack:2 group:4 [numa(memory=96GiB)] l3:3 core:8 pu:2");
  ASSERT_OK(model);
  NodeSummary s = model->summary();
  EXPECT_EQ(s.packages, 2);
  EXPECT_EQ(s.numa_domains, 8);
  EXPECT_EQ(s.l3_groups, 24);
  EXPECT_EQ(s.cores, 192);
  EXPECT_EQ(s.pus, 384);
  EXPECT_EQ(s.memory_bytes, 768 * kGiB);
  for (const auto& d : model->numaDomains()) {
    EXPECT_EQ(d.cores.size(), 24u);
    EXPECT_EQ(d.l3_groups.size(), 3u);
    EXPECT_EQ(d.memory_bytes, 96 * kGiB);
    EXPECT_EQ(d.package, d.index / 4);
  }
  EXPECT_EQ(model->packages()[1].numa, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(model->numaDomains()[0].cpuset, "0-47");
  EXPECT_EQ(model->numaDomains()[7].cpuset, "336-383");
}

TEST(NodeModel, AliasesNameTheCellNode) {
  auto model = NodeModel::fromSpec("2x96c-1.5t");
  ASSERT_OK(model);
  NodeSummary s = model->summary();
  EXPECT_EQ(s.cores, 192);
  EXPECT_EQ(s.pus, 192);
  EXPECT_EQ(s.memory_bytes, 1536 * kGiB);
  auto smt = NodeModel::fromSpec("2x96c-1.5t-smt");
  ASSERT_OK(smt);
  EXPECT_EQ(smt->summary().pus, 384);
  auto nps4 = NodeModel::fromSpec("2x96c-1.5t-nps4");
  ASSERT_OK(nps4);
  EXPECT_EQ(nps4->summary().numa_domains, 8);
  EXPECT_EQ(nps4->summary().memory_bytes, 1536 * kGiB);
}

TEST(NodeModel, BadSyntheticDescriptionIsAClearError) {
  auto model = NodeModel::fromSynthetic("pack:two core:x");
  ASSERT_ERROR(model, ErrorCode::kInvalidArgument);
  EXPECT_NE(model.error().message().find("pack:two core:x"), std::string::npos);
  ASSERT_FALSE(NodeModel::fromXmlFile("/nonexistent/node.xml").ok());
}

TEST(NodeModel, XmlRoundTripKeepsTheShape) {
  testing::TempDir dir;
  std::string path = dir.path() + "/node.xml";
  const std::string spec = "pack:2 group:4 [numa(memory=96GiB)] l3:3 core:8 pu:2";
  ASSERT_OK(exportTopologyXml(spec, path));
  auto synthetic = NodeModel::fromSynthetic(spec);
  auto loaded = NodeModel::fromXmlFile(path);
  ASSERT_OK(synthetic);
  ASSERT_OK(loaded);
  NodeSummary a = synthetic->summary();
  NodeSummary b = loaded->summary();
  EXPECT_EQ(a.packages, b.packages);
  EXPECT_EQ(a.numa_domains, b.numa_domains);
  EXPECT_EQ(a.l3_groups, b.l3_groups);
  EXPECT_EQ(a.cores, b.cores);
  EXPECT_EQ(a.pus, b.pus);
  EXPECT_EQ(a.memory_bytes, b.memory_bytes);
  ASSERT_EQ(synthetic->numaDomains().size(), loaded->numaDomains().size());
  for (size_t i = 0; i < loaded->numaDomains().size(); ++i) {
    EXPECT_EQ(synthetic->numaDomains()[i].cpuset, loaded->numaDomains()[i].cpuset);
    EXPECT_EQ(synthetic->numaDomains()[i].memory_bytes, loaded->numaDomains()[i].memory_bytes);
  }
  // fromSpec recognises the file as XML.
  auto by_spec = NodeModel::fromSpec(path);
  ASSERT_OK(by_spec);
  EXPECT_EQ(by_spec->summary().pus, 384);
  EXPECT_EQ(by_spec->source(), "xml:" + path);
}

}  // namespace
}  // namespace dsec::placement

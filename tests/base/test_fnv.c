#include "base/fnv.h"
#include "nf_test.h"

int main(void)
{
    /* Test vectors from the FNV reference (Fowler/Noll/Vo, FNV-1a 64-bit). */
    CHECK_EQ_U64(nf_fnv1a64("", 0), 0xcbf29ce484222325ULL);
    CHECK_EQ_U64(nf_fnv1a64("a", 1), 0xaf63dc4c8601ec8cULL);
    CHECK_EQ_U64(nf_fnv1a64("foobar", 6), 0x85944171f73967e8ULL);
    /* Incremental hashing equals one-shot hashing. */
    uint64_t h = nf_fnv1a64_update(NF_FNV1A64_INIT, "foo", 3);
    CHECK_EQ_U64(nf_fnv1a64_update(h, "bar", 3), 0x85944171f73967e8ULL);
    /* One flipped bit changes the witness. */
    CHECK(nf_fnv1a64("foobas", 6) != nf_fnv1a64("foobar", 6));
    return nf_test_report();
}

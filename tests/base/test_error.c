#include "base/error.h"
#include "nf_test.h"

int main(void)
{
    nf_error e;
    nf_error_clear(&e);
    CHECK_EQ_INT(e.code, NF_OK);
    CHECK_EQ_INT(e.msg[0], 0);

    CHECK_EQ_INT(nf_error_set(&e, NF_ERR_FORMAT, "tensor '%s': offset %d not aligned", "w", 17), NF_ERR_FORMAT);
    CHECK_EQ_INT(e.code, NF_ERR_FORMAT);
    CHECK(strcmp(e.msg, "tensor 'w': offset 17 not aligned") == 0);

    CHECK_EQ_INT(nf_error_prefix(&e, "%s", "model.nf"), NF_ERR_FORMAT);
    CHECK(strcmp(e.msg, "model.nf: tensor 'w': offset 17 not aligned") == 0);

    /* NULL error pointers are allowed everywhere and still return the code. */
    CHECK_EQ_INT(nf_error_set(NULL, NF_ERR_IO, "x"), NF_ERR_IO);
    CHECK_EQ_INT(nf_error_prefix(NULL, "x"), NF_OK);
    nf_error_clear(NULL);

    /* An over-long message is truncated, never overflowed. */
    char big[2000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    nf_error_set(&e, NF_ERR_IO, "%s", big);
    CHECK_EQ_INT(strlen(e.msg), NF_ERROR_MSG_MAX - 1);
    nf_error_prefix(&e, "%s", big);
    CHECK_EQ_INT(strlen(e.msg), NF_ERROR_MSG_MAX - 1);

    /* Every status has a distinct name; out-of-range values do not crash. */
    for (int i = 0; i < NF_STATUS_COUNT; i++) {
        CHECK(nf_status_name((nf_status)i) != NULL);
        for (int j = 0; j < i; j++) CHECK(strcmp(nf_status_name((nf_status)i), nf_status_name((nf_status)j)) != 0);
    }
    CHECK(strcmp(nf_status_name((nf_status)999), "unknown status") == 0);
    return nf_test_report();
}

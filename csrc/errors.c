/* errors.c - snap_strerror: human-readable names of snapstore's C return codes. */
#include "snapstore.h"

const char *snap_strerror(int code)
{
    switch (code) {
    case SNAP_OK:
        return "success";
    case SNAP_EINVAL:
        return "invalid argument (NULL pointer with nonzero length, bad page size, "
               "bad chunk sizes, bad item size, delta mode or flags, overlapping buffers, "
               "or a range outside the buffer)";
    case SNAP_ESPACE:
        return "output array too small for the result";
    case SNAP_ESTATE:
        return "object not initialised (bad magic)";
    case SNAP_ESYS:
        return "a system call failed (its errno is in the err out-parameter)";
    case SNAP_EDATA:
        return "input bytes fail their checks (a damaged chunk record)";
    case SNAP_ENOMEM:
        return "out of memory (a library's context could not be allocated)";
    default:
        return "unknown snapstore error code";
    }
}

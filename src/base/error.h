/* Error reporting for library code: functions return a status (0 ok, -1 error) and leave
 * a message here; only the command-line front end prints it and ends the job. */
#ifndef PT_ERROR_H
#define PT_ERROR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Records a printf-style message for this thread and returns -1, so that
 * `return pt_error_set("...")` reports and fails in one line. */
int pt_error_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The last message recorded on this thread ("" when none). Owned by the library. */
const char *pt_error_get(void);
void pt_error_clear(void);

#ifdef __cplusplus
}
#endif

#endif

#include "common/jobname.h"

#include <string.h>

const char *job_name_problem(const char *s, size_t n, char *bad)
{
	if (n == 0)
		return "it is empty";
	if (n > JOB_NAME_MAX)
		return "it is longer than " JOB_NAME_MAX_S " bytes";
	if (s[0] == '.' || s[0] == '-')
		return "it must not start with '.' or '-'";
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-')) {
			*bad = c;
			return "it may contain only letters, digits, '.', '_' and '-'";
		}
	}
	return NULL;
}

bool job_name_ok(const char *s)
{
	char bad;

	/* JOB_NAME_MAX + 1 bytes at most: a longer name is refused unread */
	return s && !job_name_problem(s, strnlen(s, JOB_NAME_MAX + 1), &bad);
}

/* bucket_listing.h: the listing fixture both bucket test files use
 * (test_bucket.c's wire-level tests, test_bucket_conformance.c's suite):
 * seven objects that hold their own names as bytes, the listings they
 * give, collectors for bkt_list() and bkt_list_ex() (names, prefixes, sizes;
 * a listed CRC32C is checked). Include after <cmocka.h>. */
#ifndef MTCFS_TESTS_UNIT_BUCKET_LISTING_H
#define MTCFS_TESTS_UNIT_BUCKET_LISTING_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tiers/bucket.h"
#include "tiers/manifest.h"

struct seen {
	char names[64][128];
	bool pfx[64];
	uint64_t size[64];
	int n;
	int stop_after;
};

static inline int collect(void *arg, const char *name, bool is_prefix, uint64_t size)
{
	struct seen *s = arg;

	assert_true(s->n < 64);
	snprintf(s->names[s->n], sizeof(s->names[0]), "%s", name);
	s->pfx[s->n] = is_prefix;
	s->size[s->n] = size;
	s->n++;
	return s->stop_after && s->n == s->stop_after ? 42 : 0;
}

/* bkt_list_ex()'s callback: as collect(), and what every backend keeps: a
 * prefix has no CRC32C; an object's is optional (file:// lists none) and
 * right when given (the objects hold their own names). */
static inline int collect_ex(void *arg, const struct bkt_entry *e)
{
	struct seen *s = arg;

	assert_true(s->n < 64);
	snprintf(s->names[s->n], sizeof(s->names[0]), "%s", e->name);
	s->pfx[s->n] = e->is_prefix;
	s->size[s->n] = e->size;
	if (e->is_prefix)
		assert_false(e->has_crc);
	if (e->has_crc)
		assert_int_equal(e->crc32c, mf_crc32c(0, e->name, strlen(e->name)));
	s->n++;
	return 0;
}

/* The objects of populate_listing() hold their own names as bytes. */
static inline void expect_list(struct bkt *b, const char *prefix, const char *delim,
			       const char *const *want, size_t nwant)
{
	struct seen s = { 0 };

	assert_int_equal(bkt_list(b, prefix, delim, collect, &s), 0);
	if ((size_t)s.n != nwant) {
		for (int i = 0; i < s.n; i++)
			print_error("  got %s\n", s.names[i]);
	}
	assert_int_equal(s.n, nwant);
	for (size_t i = 0; i < nwant; i++) {
		bool pfx = want[i][strlen(want[i]) - 1] == '/';
		assert_string_equal(s.names[i], want[i]);
		assert_int_equal(s.pfx[i], pfx);
		if (!pfx)
			assert_int_equal(s.size[i], strlen(want[i]));
	}
}

static const char *const listing_objs[] = { "a/1", "a/2", "a.txt", "b/c/d", "z", "a0", "b/e" };
static const char *const all_sorted[] = { "a.txt", "a/1", "a/2", "a0", "b/c/d", "b/e", "z" };
static const char *const top_delim[] = { "a.txt", "a/", "a0", "b/", "z" };
static const char *const a_delim[] = { "a/1", "a/2" };
static const char *const b_delim[] = { "b/c/", "b/e" };
static const char *const pa_delim[] = { "a.txt", "a/", "a0" };

static inline void populate_listing(struct bkt *b)
{
	for (size_t i = 0; i < sizeof(listing_objs) / sizeof(listing_objs[0]); i++)
		assert_int_equal(bkt_put_buf(b, listing_objs[i], listing_objs[i],
					     strlen(listing_objs[i])), 0);
}

/* What populate_listing()'s objects list as, with and without "/", and a
 * callback's non-zero return stopping the listing. */
static inline void check_listings(struct bkt *b)
{
	struct seen s = { .stop_after = 2 };

	expect_list(b, "", NULL, all_sorted, 7);
	expect_list(b, "", "/", top_delim, 5);
	expect_list(b, "a/", "/", a_delim, 2);
	expect_list(b, "b/", "/", b_delim, 2);
	expect_list(b, "a", "/", pa_delim, 3);
	expect_list(b, "nothing/", "/", NULL, 0);
	assert_int_equal(bkt_list(b, "", NULL, collect, &s), 42);   /* the callback stops it */
	assert_int_equal(s.n, 2);
}

#endif

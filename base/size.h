/* size.h — sizes as people write them, for options (ckpt --buffer-size and --max-shard-size,
 * ckptfs -o cache_mem), and as people read them.
 *
 * Contract: ck_parse_size accepts digits, then optionally K, M or G, KiB, MiB or GiB (also Ki, Mi,
 * Gi; any case), binary; KB, MB, GB binary too, or decimal with decimal_b, as save_pretrained
 * reads them (huggingface_hub's convert_file_size_to_int). It returns 0 when s is not one, or
 * is 0, or overflows.
 */
#ifndef CK_SIZE_H
#define CK_SIZE_H

#include <stddef.h>
#include <stdint.h>

uint64_t ck_parse_size(const char *s, int decimal_b);

/* b bytes for people, binary: "812 B", "1.5 KiB" ... "3.2 PiB" (one decimal past bytes). */
void ck_size_human(uint64_t b, char *buf, size_t cap);

#endif

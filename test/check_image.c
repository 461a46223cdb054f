/* check_image.c - placeholder: the image suite is being written (issue 3). */
#include "cwt.h"

Suite *
cwt_image_suite(void)
{
	return suite_create("image");
}

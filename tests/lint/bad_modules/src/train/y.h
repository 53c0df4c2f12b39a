#include "config/x.h"

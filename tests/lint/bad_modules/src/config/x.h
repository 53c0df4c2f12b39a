#include "train/trainer.h"

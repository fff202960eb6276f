"""Suite-wide settings."""

import torch

# Tiny CPU models gain nothing from intra-op threads, and on a shared 2-core machine
# oversubscribed threads make them tens of times slower.
torch.set_num_threads(1)

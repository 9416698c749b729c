"""The example's models, saved as frozen TorchScript files (random weights: nothing is downloaded).

    resnet50: image classification, float32 [B, 3, 224, 224] -> logits [B, 1000]
    bert:     BERT-base sentence embeddings, int64 token ids [B, S] and a 0/1 mask [B, S] -> [B, 768]
              (the mean of the last hidden states over the mask)

A file is what a serving team deploys: the server loads it with torch.jit.load and knows nothing
of the Python classes below.
"""
import os

import torch
import torch.nn as nn

VOCAB = 30522  # BERT-base's


class MeanPooledBert(nn.Module):
    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, ids, mask):
        hidden = self.bert(input_ids=ids, attention_mask=mask)[0]
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(1) / weights.sum(1)


def resnet50():
    import torchvision

    return torchvision.models.resnet50().eval(), (torch.rand(1, 3, 224, 224),)


def bert():
    from transformers import BertConfig, BertModel

    model = MeanPooledBert(BertModel(BertConfig(return_dict=False, torchscript=True))).eval()
    return model, (torch.randint(0, VOCAB, (1, 16)), torch.ones(1, 16, dtype=torch.long))


BUILDERS = {"resnet50": resnet50, "bert": bert}


def saved(name, directory):
    """The path of model `name`'s TorchScript file in `directory`, built and saved first if missing."""
    path = os.path.join(directory, f"{name}.pt")
    if not os.path.exists(path):
        os.makedirs(directory, exist_ok=True)
        torch.manual_seed(0)
        model, example = BUILDERS[name]()
        with torch.no_grad():
            script = torch.jit.freeze(torch.jit.trace(model, example, check_trace=False))
        torch.jit.save(script, path + ".tmp")
        os.replace(path + ".tmp", path)  # a reader never sees half a file
    return path

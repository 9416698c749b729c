"""The benchmark's models, random weights (nothing downloaded), each with its example inputs. Some
come from torchvision or transformers (PACKAGE): optional, named when missing."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class DeepAndWide(nn.Module):
    """PyTorch's static-runtime benchmark model: framework overhead, not arithmetic, dominates."""

    def __init__(self, num_features=50):
        super().__init__()
        self.mu = nn.Parameter(torch.randn(1, num_features))
        self.sigma = nn.Parameter(torch.randn(1, num_features))
        self.fc_w = nn.Parameter(torch.randn(1, num_features + 1))
        self.fc_b = nn.Parameter(torch.randn(1))

    def forward(self, ad_emb_packed, user_emb, wide):
        wide_preproc = ((wide + self.mu) * self.sigma).clamp(0, 10)
        dp = torch.bmm(ad_emb_packed, user_emb.transpose(1, 2)).flatten(1)
        features = torch.cat([dp, wide_preproc], 1)
        return torch.sigmoid(torch.addmm(self.fc_b, features, self.fc_w.t()))


class LLD6(nn.Module):
    """Six linear layers with leaky_relu(0.01) and dropout (eval: identity)."""

    def __init__(self):
        super().__init__()
        sizes = [128, 256, 256, 512, 256, 256, 128]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        for layer in self.layers:
            x = self.dropout(F.leaky_relu(layer(x), 0.01))
        return x


class XMLCNN(nn.Module):
    """XML-CNN (extreme multi-label text classification): embedding, 1-d convs of widths 2/4/8,
    dynamic max-pooling, concat, bottleneck linear, output linear. Scaled to this 2-core machine:
    batch 8, 128 tokens, 4,096 labels (the paper's runs use up to 670k labels)."""

    def __init__(self, vocab=30000, emb=304, filters=32, seq=128, pool_chunks=8, hidden=512, labels=4096):
        super().__init__()
        self.embedding = nn.Embedding(vocab, emb)
        self.convs = nn.ModuleList(nn.Conv1d(emb, filters, k, stride=2) for k in (2, 4, 8))
        self.pool_chunks = pool_chunks
        width = sum(filters * pool_chunks for _ in self.convs)
        self.bottleneck = nn.Linear(width, hidden)
        self.out = nn.Linear(hidden, labels)

    def forward(self, tokens):
        x = self.embedding(tokens).transpose(1, 2)
        pooled = [F.adaptive_max_pool1d(F.relu(conv(x)), self.pool_chunks).flatten(1) for conv in self.convs]
        return self.out(F.relu(self.bottleneck(torch.cat(pooled, 1))))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))

    def forward(self, x):
        return self.net(x)


class BertWrapper(nn.Module):
    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask)[0]


def bert_base(batch, seq=128):
    from transformers import BertConfig, BertModel

    config = BertConfig(return_dict=False, torchscript=True)
    model = BertWrapper(BertModel(config))
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    return model, (ids, torch.ones(batch, seq, dtype=torch.long))


def distilbert(batch, seq=128):
    from transformers import DistilBertConfig, DistilBertModel

    config = DistilBertConfig(return_dict=False, torchscript=True)
    model = BertWrapper(DistilBertModel(config))
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    return model, (ids, torch.ones(batch, seq, dtype=torch.long))


# One encoder layer's parts, timed alone for a per-layer table: attention (the q, k and v
# projections, attention, the output projection), ffn (FC1, GELU, FC2) and norm (a residual add and
# its layer norm; a layer has two).
class BertAttention(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.self_attention, self.dense = layer.attention.self, layer.attention.output.dense

    def forward(self, h, mask):
        return self.dense(self.self_attention(h, mask)[0])


class BertFeedForward(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.intermediate, self.dense = layer.intermediate, layer.output.dense

    def forward(self, h):
        return self.dense(self.intermediate(h))


class VitAttention(nn.Module):
    def __init__(self, block):
        super().__init__()
        self.attention = block.self_attention

    def forward(self, h):
        return self.attention(h, h, h, need_weights=False)[0]


class AddNorm(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, h, residual):
        return self.norm(h + residual)


def bert_layer_part(part, seq=128):
    """BERT-base's layer 0 (as bert_base: sequence 128, the boolean mask transformers passes)."""
    def make(batch):
        from transformers import BertConfig
        from transformers.models.bert.modeling_bert import BertLayer

        config = BertConfig(return_dict=False, torchscript=True)
        config._attn_implementation = "sdpa"  # what BertModel picks
        layer = BertLayer(config)
        h = torch.randn(batch, seq, config.hidden_size)
        if part == "attention":
            return BertAttention(layer), (h, torch.ones(batch, 1, seq, seq, dtype=torch.bool))
        if part == "ffn":
            return BertFeedForward(layer), (h,)
        return AddNorm(layer.output.LayerNorm), (h, torch.randn(h.shape))

    return make


def vit_layer_part(part, tokens=197):
    """ViT-B/16's first encoder block (as vit_b_16: 224x224, 197 tokens)."""
    def make(batch):
        import torchvision

        block = torchvision.models.vit_b_16().encoder.layers[0]
        h = torch.randn(batch, tokens, 768)
        if part == "attention":
            return VitAttention(block), (h,)
        if part == "ffn":
            return block.mlp, (h,)
        return AddNorm(block.ln_2), (h, torch.randn(h.shape))

    return make


def with_batch_norm_statistics(model, size):
    """model with its batch norms' running statistics measured on random images, as training leaves
    them: each normalizes its channels. At init (mean 0, variance 1) MobileNetV2's activations shrink
    ~10x every few blocks, to outputs of ~1e-9, below one int8 step: its int8 models computed zeros
    and a drift from fp32 meant nothing."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return model
    generator = torch.Generator().manual_seed(1)
    momenta = [m.momentum for m in norms]  # MobileNetV3's are 0.01
    model.train()
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the batches
    with torch.no_grad():
        for _ in range(2):
            model(torch.rand(8, 3, size, size, generator=generator))
    for m, momentum in zip(norms, momenta):
        m.momentum = momentum
    return model.eval()


def informative(model):
    """Random init zeroes some heads (ViT's, for one), and then every output is 0 and any
    comparison passes. Give such weights small random values so the outputs mean something."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0, 0.02)
    return model


def torchvision_model(name, size):
    def make(batch):
        import torchvision

        # informative: ViT's zero-initialized head gives outputs all 0, and any max diff 0
        model = with_batch_norm_statistics(informative(getattr(torchvision.models, name)()), size)
        return model, (torch.rand(batch, 3, size, size),)

    return make


class FirstOf(nn.Module):
    """A model's first output (or its "out" entry): one tensor, whatever the model returns."""

    def __init__(self, model, **kwargs):
        super().__init__()
        self.model = model
        self.kwargs = kwargs

    def forward(self, *args):
        out = self.model(*args, **self.kwargs)
        return out["out"] if isinstance(out, dict) else out[0] if isinstance(out, (tuple, list)) else out


def segmentation(name, size):
    def make(batch):
        import torchvision

        return FirstOf(getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None)), \
            (torch.rand(batch, 3, size, size),)

    return make


class DetectionFeatures(nn.Module):
    """A detector without its post-processing: backbone + FPN and the RPN head (Faster R-CNN) or the
    class and box heads (RetinaNet), their outputs flattened into one tensor."""

    def __init__(self, detector):
        super().__init__()
        self.backbone = detector.backbone
        self.rpn_head = getattr(detector, "rpn", None) and detector.rpn.head
        self.head = getattr(detector, "head", None)

    def forward(self, x):
        features = list(self.backbone(x).values())
        if self.rpn_head is not None:
            logits, boxes = self.rpn_head(features)
            outs = logits + boxes
        else:
            outs = [self.head.classification_head(features), self.head.regression_head(features)]
        return torch.cat([o.flatten(1) for o in outs], 1)


def detection(name, size):
    def make(batch):
        import torchvision

        detector = getattr(torchvision.models.detection, name)(weights=None, weights_backbone=None)
        return DetectionFeatures(detector), (torch.rand(batch, 3, size, size),)

    return make


def unet_small(batch):
    """A text-conditioned diffusion UNet (diffusers' UNet2DConditionModel, Stable Diffusion's
    blocks at a small width): conv, group norm + SiLU, cross-attention, upsampling."""
    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel(sample_size=32, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(64, 128, 128), norm_num_groups=32, cross_attention_dim=128,
                                attention_head_dim=8, down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"))
    return FirstOf(unet, return_dict=False), (torch.randn(batch, 4, 32, 32), torch.tensor([10.0]), torch.randn(batch, 16, 128))


def whisper_encoder(batch):
    """Whisper's audio encoder (tiny's shape): two 1-D convs with GELU over 80 mel bins, then a
    transformer encoder over 1,500 frames."""
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    config = WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536, num_mel_bins=80)
    return FirstOf(WhisperEncoder(config), return_dict=False), (torch.randn(batch, 80, 3000),)


def t5_encoder(batch, seq=128):
    """T5's encoder (t5-small's shape): RMS norm written out as pow/mean/rsqrt/mul, relative position bias."""
    from transformers import T5Config, T5EncoderModel

    config = T5Config(d_model=512, num_layers=6, num_heads=8, d_ff=2048, d_kv=64)
    return FirstOf(T5EncoderModel(config), return_dict=False), (torch.randint(0, config.vocab_size, (batch, seq)),)


# name -> (batch -> (model, inputs)); the default batch is 1 unless the name says otherwise.
MODELS = {
    "resnet50": torchvision_model("resnet50", 224),
    "resnet18_64": torchvision_model("resnet18", 64),
    "mobilenet_v2": torchvision_model("mobilenet_v2", 224),
    "mobilenet_v3_large": torchvision_model("mobilenet_v3_large", 224),
    "vit_b_16": torchvision_model("vit_b_16", 224),
    "bert_base": bert_base,
    "distilbert": distilbert,
    "deep_and_wide": lambda b: (DeepAndWide(), (torch.randn(b, 1, 32), torch.randn(b, 1, 32), torch.randn(b, 50))),
    "deep_and_wide_64": lambda b: (DeepAndWide(), (torch.randn(64, 1, 32), torch.randn(64, 1, 32), torch.randn(64, 50))),
    "lld6": lambda b: (LLD6(), (torch.randn(32 * b, 128),)),
    "xml_cnn": lambda b: (XMLCNN(), (torch.randint(0, 30000, (8 * b, 128)),)),
    "mlp": lambda b: (MLP(), (torch.randn(b, 256),)),
}

# Beyond classifiers: segmentation, detection, diffusion, speech.
BEYOND = {
    "deeplabv3_mobilenet_v3": segmentation("deeplabv3_mobilenet_v3_large", 256),
    "fcn_resnet50": segmentation("fcn_resnet50", 256),
    "fasterrcnn_mobilenet_fpn": detection("fasterrcnn_mobilenet_v3_large_fpn", 320),
    "retinanet_resnet50_fpn": detection("retinanet_resnet50_fpn", 320),
    "unet_small": unet_small,
    "whisper_encoder": whisper_encoder,
    "t5_encoder": t5_encoder,
}
MODELS.update(BEYOND)

# Parts of one encoder layer, for per-layer tables (attention, FFN, norm: a layer has two norms).
LAYER_PARTS = {f"{model}_layer_{part}": make(part) for model, make in (("bert", bert_layer_part), ("vit", vit_layer_part))
               for part in ("attention", "ffn", "norm")}
MODELS.update(LAYER_PARTS)

# The machine's conv throughput reference: one large 3x3 conv (3.7 GFLOP).
MODELS["conv3x3_512"] = lambda b: (nn.Conv2d(512, 512, 3, padding=1), (torch.rand(b, 512, 28, 28),))

# The package a model's definition comes from, beyond torch.
PACKAGE = {**dict.fromkeys(["resnet50", "resnet18_64", "mobilenet_v2", "mobilenet_v3_large", "vit_b_16"], "torchvision"),
           "bert_base": "transformers", "distilbert": "transformers",
           **{name: "transformers" if name.startswith("bert") else "torchvision" for name in LAYER_PARTS},
           **dict.fromkeys(["deeplabv3_mobilenet_v3", "fcn_resnet50", "fasterrcnn_mobilenet_fpn", "retinanet_resnet50_fpn"], "torchvision"),
           "unet_small": "diffusers", "whisper_encoder": "transformers", "t5_encoder": "transformers"}
